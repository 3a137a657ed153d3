"""The real text `radixmesh bench radix` builds its workloads from (radix_workloads.py): few-shot
prefixes in two subjects with their questions, chat openers and follow-ups, tree-of-thought
problems, approaches and steps, and sentences that share nothing."""

from __future__ import annotations

from collections.abc import Sequence

# -- text -------------------------------------------------------------------------------------
GEOGRAPHY_SHOTS = [
    (
        "Which river flows through the city of Cairo?",
        "The Nile",
        "Cairo lies on the banks of the Nile, close to where the river fans out into its delta.",
    ),
    (
        "What is the highest mountain in Africa?",
        "Kilimanjaro",
        "Mount Kilimanjaro in Tanzania rises to about 5,895 metres above sea level.",
    ),
    (
        "Which ocean lies between Africa and Australia?",
        "The Indian Ocean",
        "The Indian Ocean is bounded by Africa to the west and Australia to the east.",
    ),
    (
        "What is the capital city of Canada?",
        "Ottawa",
        "Ottawa, in the province of Ontario, was chosen as the capital in 1857.",
    ),
    (
        "Which desert covers most of northern Africa?",
        "The Sahara",
        "The Sahara is the largest hot desert in the world, spanning eleven countries.",
    ),
]
GEOGRAPHY_QUESTIONS = [
    "Which country has the longest coastline in the world?",
    "What is the capital city of Australia?",
    "Which river is the longest in South America?",
    "On which continent is the Gobi Desert?",
    "What is the largest island in the Mediterranean Sea?",
    "Which strait separates Europe from Africa?",
    "What is the capital city of Kenya?",
    "Which mountain range runs along the border of France and Spain?",
    "In which country is the city of Marrakesh?",
    "Which lake is the deepest in the world?",
    "What is the smallest country in the world by area?",
    "Which sea lies to the north of Turkey?",
    "What is the capital city of Peru?",
    "Which river flows through Budapest and Vienna?",
    "Which country is known as the land of a thousand lakes?",
    "What is the largest country in South America?",
    "Which volcano destroyed the town of Pompeii?",
    "In which ocean are the Maldives?",
    "What is the capital city of Norway?",
    "Which canal connects the Mediterranean Sea to the Red Sea?",
]
CHEMISTRY_SHOTS = [
    (
        "What is the chemical symbol for sodium?",
        "Na",
        "The symbol comes from natrium, the Latin name of the element.",
    ),
    (
        "Which gas makes up most of the air we breathe?",
        "Nitrogen",
        "Dry air is about 78 percent nitrogen and 21 percent oxygen by volume.",
    ),
    (
        "What is the pH of pure water at room temperature?",
        "7",
        "Pure water is neutral: its hydrogen and hydroxide ion concentrations are equal.",
    ),
    (
        "Which element has the atomic number 6?",
        "Carbon",
        "Every carbon atom has six protons in its nucleus.",
    ),
    (
        "What do we call a reaction that releases heat?",
        "Exothermic",
        "Burning wood is a familiar exothermic reaction: it gives off heat and light.",
    ),
]
CHEMISTRY_QUESTIONS = [
    "What is the chemical formula of table salt?",
    "Which metal is liquid at room temperature?",
    "What is the lightest element?",
    "Which gas do plants absorb during photosynthesis?",
    "What is the most abundant element in the Earth's crust?",
    "Which acid is found in the human stomach?",
    "What is the chemical symbol for gold?",
    "How many electrons can the first shell of an atom hold?",
    "What is the name of the process by which a solid turns directly into a gas?",
    "Which element is needed to make steel from iron?",
    "What is the common name for frozen carbon dioxide?",
    "Which noble gas glows red in advertising signs?",
    "What particle has a positive charge in an atom?",
    "Which element gives bones their hardness?",
    "What is the chemical formula of methane?",
    "Which vitamin is made in the skin under sunlight?",
    "What kind of bond holds the two atoms of a hydrogen molecule together?",
    "Which metal rusts when exposed to water and air?",
    "What is the boiling point of water in degrees Fahrenheit at sea level?",
    "Which element is the main component of diamonds?",
]
CHAT_SYSTEM = (
    "You are a patient cooking assistant. Answer in one or two short sentences, "
    "suggest practical substitutions, and mention food safety when it matters."
)
CHAT_OPENERS = [
    "I want to bake bread at home for the first time. What flour should I buy?",
    "How do I cook rice so that it does not stick to the pot?",
    "What is the easiest way to make a tomato soup from scratch?",
    "Can you help me plan a vegetarian dinner for four people?",
    "How long should I boil an egg if I want a runny yolk?",
    "My pancakes always come out flat. What am I doing wrong?",
    "What spices go well with roasted carrots?",
    "How do I keep fresh herbs from wilting in the fridge?",
    "What is a good way to use leftover cooked chicken?",
    "How can I make a simple salad dressing without vinegar?",
    "What should I do if my soup turned out too salty?",
    "How do I know when a steak is medium rare?",
]
CHAT_FOLLOWUPS = [
    "That sounds good. How long will it take?",
    "What can I use instead if I do not have that?",
    "Is there anything I should be careful about?",
]
TOT_PROBLEMS = [
    "A farmer has 17 sheep and all but 9 run away. A neighbour then gives him twice as many "
    "sheep as he has left. How many sheep does the farmer have now? Think step by step.",
    "A train leaves at 9:40 and the journey takes 2 hours and 35 minutes, but it is delayed by "
    "a quarter of an hour on the way. At what time does it arrive? Think step by step.",
    "Three friends share a bill of 84 dollars. One of them pays twice as much as each of the "
    "other two, who pay equal shares. How much does each friend pay? Think step by step.",
]
TOT_APPROACHES = [
    "Approach: write down every quantity given in the problem before doing anything else.",
    "Approach: work backwards from what the question asks for.",
    "Approach: translate each sentence into a small equation and solve them in order.",
    "Approach: estimate a rough answer first, then compute it exactly and compare.",
]
TOT_STEPS = [
    "Step one: identify the unknown and give it a name.",
    "Step two: check the arithmetic of each intermediate result.",
    "Step three: state the final answer in a complete sentence.",
]
NO_REUSE_SENTENCES = [
    "Glaciers carve deep valleys as they slowly slide downhill under their own weight.",
    "Honeybees communicate the direction of flowers through a waggle dance inside the hive.",
    "Medieval cathedrals often took more than a century to complete.",
    "Copper wires carry electricity because their electrons move freely between atoms.",
    "Octopuses can change the colour and texture of their skin in a fraction of a second.",
    "Printing presses spread pamphlets across Europe within weeks of their writing.",
    "Desert plants store water in thick leaves and open their pores only at night.",
    "Lighthouses once relied on oil lamps and polished mirrors to guide ships at night.",
    "Volcanic soil is rich in minerals, which is why farms cluster near active volcanoes.",
    "Chess engines evaluate millions of positions every second before choosing a move.",
    "Salmon return to the river where they hatched, guided partly by smell.",
    "Roman aqueducts moved water for dozens of kilometres using only gravity.",
    "Jazz musicians improvise melodies over a repeating sequence of chords.",
    "Owls can turn their heads much further than most other birds.",
    "Early photographs required the subject to stay still for several minutes.",
    "Bamboo is among the fastest growing plants and can rise almost a metre in a day.",
    "Sailors measured their speed by counting knots on a rope paid out behind the ship.",
    "Tea was first drunk as a medicine before it became an everyday drink.",
    "Hummingbirds beat their wings so fast that they appear as a blur.",
    "Suspension bridges hang their decks from cables draped over tall towers.",
    "Coral reefs are built by tiny animals that deposit limestone skeletons.",
    "Kites were used in ancient China to send signals across long distances.",
    "Maple syrup is made by boiling down the sap collected in early spring.",
    "Penguins huddle together in winter, taking turns on the cold outer edge.",
    "Clockmakers used springs and escapements to keep time without a pendulum.",
    "Wolves travel in packs led by a breeding pair and their grown offspring.",
    "Paper money first appeared in China more than a thousand years ago.",
    "Snowflakes form six-sided crystals because of the shape of water molecules.",
    "Windmills ground grain and pumped water long before they generated electricity.",
    "Crows can recognise individual human faces and remember them for years.",
    "Silk is spun by caterpillars that wrap themselves in a single long thread.",
    "Tides rise and fall twice a day as the Moon pulls on the oceans.",
]


def few_shot_prefix(subject: str, shots: Sequence[tuple[str, str, str]]) -> str:
    parts = [
        f"The following are questions about {subject}, each with a short answer and an "
        "explanation.\n\n"
    ]
    for q, a, why in shots:
        parts.append(f"Question: {q}\nAnswer: {a}. {why}\n\n")
    return "".join(parts)
