"""model.proto <-> step_ops dataclasses. Integer arrays are packed little-endian int32."""

from __future__ import annotations

from radixmesh_wire.packing import pack_f32, pack_i32, unpack_f32, unpack_i32
from radixmesh_wire.pb import model_pb2
from radixmesh_wire.step_ops import AdmitOp, ExtendOp, Sampling, StepOps, StepOutput


def decode_step(msg: model_pb2.Step) -> StepOps:
    ops = StepOps(step_id=msg.step_id)
    for a in msg.admits:
        s = a.sampling
        ops.admits.append(
            AdmitOp(
                handle=a.handle,
                sampling=Sampling(
                    s.temperature,
                    s.top_p,
                    s.top_k,
                    s.min_p,
                    s.seed,
                    s.return_logprob,
                    s.top_logprobs,
                    s.prompt_logprobs_from,
                    s.min_new_tokens,
                    tuple(unpack_i32(s.stop_ids)),
                    s.presence_penalty,
                    s.frequency_penalty,
                    s.repetition_penalty or 1.0,
                    tuple(
                        zip(
                            unpack_i32(s.logit_bias_ids),
                            unpack_f32(s.logit_bias_values),
                            strict=True,
                        )
                    ),
                    tuple(unpack_i32(s.penalty_history)),
                ),
                output_offset=a.output_offset,
                prefix_slots=unpack_i32(a.prefix_slots),
                input_ids=unpack_i32(a.input_ids),
                slots=unpack_i32(a.slots),
                sample=a.sample,
            )
        )
    for e in msg.extends:
        ops.extends.append(
            ExtendOp(e.handle, unpack_i32(e.input_ids), unpack_i32(e.slots), e.sample)
        )
    ops.decode_handles = unpack_i32(msg.decode_handles)
    ops.decode_slots = unpack_i32(msg.decode_slots)
    ops.truncates = [(t.handle, t.length) for t in msg.truncates]
    ops.releases = unpack_i32(msg.release_handles)
    ops.freed_slots = unpack_i32(msg.freed_slots)
    ops.masks = {m.handle: (m.encoding, m.data) for m in msg.masks}
    ops.masks_follow = msg.masks_follow
    return ops


def encode_output(out: StepOutput) -> model_pb2.StepResult:
    res = model_pb2.StepResult(
        step_id=out.step_id,
        handles=pack_i32([r.handle for r in out.rows]),
        tokens=pack_i32([r.token for r in out.rows]),
        logprobs=pack_f32([r.logprob for r in out.rows]),
        forward_ms=out.forward_ms,
    )
    extras: dict[int, model_pb2.RowExtras] = {}
    for r in out.rows:
        if r.top_ids is not None and r.top_logprobs is not None:
            extras[r.handle] = model_pb2.RowExtras(
                handle=r.handle, top_ids=pack_i32(r.top_ids), top_logprobs=pack_f32(r.top_logprobs)
            )
    for p in out.prompt_logprobs:
        ex = extras.setdefault(p.handle, model_pb2.RowExtras(handle=p.handle))
        ex.prompt_logprobs = pack_f32(p.values)
        ex.prompt_logprobs_start = p.start
    res.extras.extend(extras.values())
    return res
