"""model.proto <-> step_ops dataclasses, both directions.

Scheduler: `encode_step`, `encode_masks`, `decode_output`, `decode_worker_info`.
Model service: `decode_step`, `decode_masks`, `encode_output`.
Integer arrays are packed little-endian int32, float arrays float32.
"""

from __future__ import annotations

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from radixmesh_wire.image_geometry import AnyresGeometry, ImageGeometry
from radixmesh_wire.images import ImageInput
from radixmesh_wire.mask_rows import EncodedRow, MaskEncoding
from radixmesh_wire.packing import pack_f32, pack_i32, unpack_f32, unpack_i32
from radixmesh_wire.pb import grammar_pb2, images_pb2, model_pb2
from radixmesh_wire.step_ops import (
    AdmitOp,
    ExtendOp,
    KVCopy,
    LateMasks,
    PromptLogprobs,
    Sampling,
    StepOps,
    StepOutcome,
    StepOutput,
    WorkerInfo,
)

_ENCODING = {int(e): e for e in MaskEncoding}  # by wire number: cheaper than MaskEncoding(n)


def _add_rows(
    field: RepeatedCompositeFieldContainer[grammar_pb2.MaskRow], masks: dict[int, EncodedRow]
) -> None:
    """Mask rows into a repeated MaskRow field (`add` is ~2x faster than building messages)."""
    add = field.add
    for h, row in masks.items():
        add(handle=h, encoding=row.encoding, data=row.data)


def _row_map(rows: list[grammar_pb2.MaskRow]) -> dict[int, EncodedRow]:
    """Rows by handle; ValueError on an encoding this side does not know."""
    out = {}
    for m in rows:
        enc = _ENCODING.get(m.encoding)
        if enc is None:
            raise ValueError(f"mask row of handle {m.handle}: unknown encoding {m.encoding}")
        out[m.handle] = EncodedRow(enc, m.data)
    return out


def _sampling(s: Sampling) -> model_pb2.RequestSampling:
    return model_pb2.RequestSampling(
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        min_p=s.min_p,
        seed=s.seed,
        has_seed=True,
        return_logprob=s.return_logprob,
        top_logprobs=s.top_logprobs,
        prompt_logprobs_from=s.prompt_logprobs_from,
        min_new_tokens=s.min_new_tokens,
        stop_ids=pack_i32(s.stop_ids),
        presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty,
        logit_bias_ids=pack_i32([tok for tok, _ in s.logit_bias]),
        logit_bias_values=pack_f32([bias for _, bias in s.logit_bias]),
        penalty_history=pack_i32(s.penalty_history),
    )


def encode_step(ops: StepOps) -> model_pb2.Step:
    # Per step: repeated fields are filled only when non-empty (passing empty lists to the
    # constructor costs more than the whole decode-only step's packing).
    msg = model_pb2.Step(
        step_id=ops.step_id,
        decode_handles=pack_i32(ops.decode_handles),
        decode_slots=pack_i32(ops.decode_slots),
        release_handles=pack_i32(ops.releases),
        freed_slots=pack_i32(ops.freed_slots),
        masks_follow=ops.masks_follow,
    )
    for a in ops.admits:
        msg.admits.add(
            handle=a.handle,
            sampling=_sampling(a.sampling),
            output_offset=a.output_offset,
            prefix_slots=pack_i32(a.prefix_slots),
            input_ids=pack_i32(a.input_ids),
            slots=pack_i32(a.slots),
            sample=a.sample,
            rid=a.rid,
            images=[image_to_proto(im) for im in a.images],
        )
    for e in ops.extends:
        msg.extends.add(
            handle=e.handle,
            input_ids=pack_i32(e.input_ids),
            slots=pack_i32(e.slots),
            sample=e.sample,
        )
    for h, n in ops.truncates:
        msg.truncates.add(handle=h, length=n)
    for c in ops.copies:
        msg.copies.add(to_host=c.to_host, src=pack_i32(c.src), dst=pack_i32(c.dst))
    if ops.masks:
        _add_rows(msg.masks, ops.masks)
    return msg


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
                rid=a.rid,
                images=tuple(image_from_proto(im) for im in a.images),
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
    ops.masks = _row_map(list(msg.masks))
    ops.masks_follow = msg.masks_follow
    ops.copies = [KVCopy(c.to_host, unpack_i32(c.src), unpack_i32(c.dst)) for c in msg.copies]
    return ops


def encode_masks(m: LateMasks) -> model_pb2.StepMasks:
    msg = model_pb2.StepMasks(step_id=m.step_id, skip_handles=pack_i32(m.skip))
    _add_rows(msg.rows, m.rows)
    return msg


def decode_masks(msg: model_pb2.StepMasks) -> LateMasks:
    return LateMasks(msg.step_id, _row_map(list(msg.rows)), unpack_i32(msg.skip_handles))


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


def decode_output(res: model_pb2.StepResult) -> StepOutcome:
    out = StepOutcome(
        step_id=res.step_id,
        handles=unpack_i32(res.handles),
        tokens=unpack_i32(res.tokens),
        logprobs=unpack_f32(res.logprobs),
        forward_ms=res.forward_ms,
        error=res.error,
    )
    for ex in res.extras:  # rows that asked for top logprobs or prompt logprobs only
        if ex.top_ids or ex.top_logprobs:
            out.top[ex.handle] = (unpack_i32(ex.top_ids), unpack_f32(ex.top_logprobs))
        if ex.prompt_logprobs:
            values = unpack_f32(ex.prompt_logprobs)
            out.prompt_logprobs.append(PromptLogprobs(ex.handle, ex.prompt_logprobs_start, values))
    return out


def decode_worker_info(info: model_pb2.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(
        model_name=info.model_name,
        kv_capacity=int(info.kv_capacity),
        context_length=int(info.context_length),
        vocab_size=int(info.vocab_size),
        nan_fill=info.nan_fill,
        eos_token_ids=tuple(info.eos_token_ids),
        device=info.device,
        host_kv_capacity=int(info.host_kv_capacity),
        image_tokens=int(info.image_tokens),
        image_geometry=layout_from_proto(info.image_layout),
    )


def layout_to_proto(geometry: ImageGeometry | None) -> images_pb2.ImageLayout:
    """A model's image layout for its WorkerInfo (an empty message: none)."""
    if geometry is None:
        return images_pb2.ImageLayout()
    msg = images_pb2.ImageLayout(tile=geometry.tile, tile_tokens=geometry.tile_tokens)
    if isinstance(geometry, AnyresGeometry):
        msg.side = geometry.side
        msg.pinpoints.extend(v for hw in geometry.pinpoints for v in hw)
    return msg


def layout_from_proto(msg: images_pb2.ImageLayout) -> ImageGeometry | None:
    """The layout a WorkerInfo carries, or None (tile 0: an older or text-only model
    service). ValueError names what is inconsistent (the layout classes check themselves)."""
    if not msg.tile:
        return None
    if not msg.pinpoints:
        return ImageGeometry(int(msg.tile), int(msg.tile_tokens))
    p = list(msg.pinpoints)
    if len(p) % 2:
        raise ValueError(f"image layout: {len(p)} pinpoint values, not (height, width) pairs")
    pairs = tuple((int(p[i]), int(p[i + 1])) for i in range(0, len(p), 2))
    return AnyresGeometry(int(msg.tile), int(msg.tile_tokens), pinpoints=pairs, side=int(msg.side))


def image_to_proto(im: ImageInput) -> images_pb2.ImageInput:
    return images_pb2.ImageInput(
        offset=im.offset,
        n_tokens=im.n_tokens,
        pseudo_id=im.pseudo_id,
        pixels=im.pixels,
        shape=list(im.shape),
        image_size=list(im.image_size) if any(im.image_size) else [],
        normalize=list(im.normalize),
    )


def image_from_proto(msg: images_pb2.ImageInput) -> ImageInput:
    """Shapes of other than 3 dimensions become (0, 0, 0) and image sizes of other than 0 or 2
    (-1, -1): `ImageInput.check` refuses them."""
    shape = tuple(msg.shape) if len(msg.shape) == 3 else (0, 0, 0)
    n = len(msg.image_size)
    size = (0, 0) if n == 0 else tuple(msg.image_size) if n == 2 else (-1, -1)
    norm = tuple(msg.normalize)
    return ImageInput(msg.offset, msg.n_tokens, msg.pseudo_id, msg.pixels, shape, size, norm)  # type: ignore[arg-type]
