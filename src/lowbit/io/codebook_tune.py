"""Whole-model codebook quantization with the calibration text (Llama family, torch on the CPU):

    packed = quantize_sequential(config, weights, ids, {"m": 1, "v": 4, "b": 8, "g": 128})
    losses = finetune(student, teacher, ids, steps=200)

quantize_sequential: GPTQ-style error feedback (codebook_gptq) with each linear's full input Hessian
H = X^T X / n, collected layer by layer from the model quantized so far (so every linear sees the error of the
ones before it: q/k/v from the quantized earlier layers, o_proj from the quantized q/k/v, gate/up after the
quantized attention, down_proj from the quantized gate/up).

finetune: the continuous step of AQLM / PV-tuning: codes frozen, the codebooks, group scales and norm weights
trained by knowledge distillation, KL(teacher || student) of the next-token distributions, over windows of the
calibration text drawn under a seed (Adam; deterministic for a seed and a thread count).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from lowbit.formats.codebook import CodebookWeight
from lowbit.io.torch_llama import LINEARS, CodebookLinear, DenseLinear, TorchLlama

CTX = 512


def windows(ids: list[int], ctx: int) -> list[torch.Tensor]:
    """Consecutive windows of at most ctx tokens (at least 2 each) -> LongTensor [1, T] each."""
    out = [torch.tensor([ids[s:s + ctx]], dtype=torch.long) for s in range(0, len(ids), ctx)]
    return [w for w in out if w.shape[1] >= 2]


def hessian(xs: list[torch.Tensor]) -> np.ndarray:
    """xs: [1, T, K] each -> X^T X / n float64 [K, K] over all their rows."""
    k = xs[0].shape[-1]
    h = torch.zeros(k, k, dtype=torch.float64)
    n = 0
    for x in xs:
        x2 = x.reshape(-1, k).double()
        h += x2.T @ x2
        n += x2.shape[0]
    return (h / max(n, 1)).numpy()


def quantize_sequential(config: dict, weights: dict, ids: list[int], options: dict, ctx: int = CTX,
                        damp: float = 0.01, progress: bool = True, quantize_one=None,
                        desc: str = "codebook error feedback") -> dict[str, CodebookWeight]:
    """Every decoder linear -> CodebookWeight (options: m, v, b, g, seed, iters, beam), with error feedback on
    the calibration tokens ids run through the partly quantized model. quantize_one(name, w [M, K], H [K, K])
    -> CodebookWeight replaces CodebookWeight.quantize(w, **options, hessian=H, damp=damp)."""
    from tqdm.auto import tqdm

    if quantize_one is None:
        def quantize_one(name, w, h):
            return CodebookWeight.quantize(w, **options, hessian=h, damp=damp)

    net = TorchLlama(config, weights)
    wins = windows(ids, ctx)
    if not wins:
        raise ValueError("the calibration text is too short (needs at least 2 tokens)")
    tables = {w.shape[1]: net.rope_tables(w.shape[1]) for w in wins}
    out = {}
    bar = tqdm(total=len(net.blocks) * len(LINEARS), desc=desc, unit="linear", disable=not progress)

    def quant(i, blk, names, xs):
        h = hessian(xs)
        for n in names:
            name = f"model.layers.{i}.{n}.weight"
            bar.set_postfix_str(name, refresh=False)
            pw = quantize_one(name, blk[n].w.numpy(), h)
            out[name] = pw
            blk.set_linear(n, DenseLinear(pw.dequantize()))
            bar.update(1)

    with torch.no_grad():
        xs = [net.embed[w] for w in wins]  # [1, T, hidden] each
        for i, blk in enumerate(net.blocks):
            h1 = [blk.norm(x, blk.ln1) for x in xs]
            quant(i, blk, LINEARS[:3], h1)
            att = [blk.attend(h, *tables[h.shape[1]]) for h in h1]
            quant(i, blk, LINEARS[3:4], att)
            xs = [x + blk["self_attn.o_proj"](a) for x, a in zip(xs, att)]
            h2 = [blk.norm(x, blk.ln2) for x in xs]
            quant(i, blk, LINEARS[4:6], h2)
            act = [blk.mlp_act(h) for h in h2]
            quant(i, blk, LINEARS[6:], act)
            xs = [x + blk["mlp.down_proj"](a) for x, a in zip(xs, act)]
    bar.close()
    return out


NORM_OF = {"self_attn.q_proj": "input_layernorm", "self_attn.k_proj": "input_layernorm",
           "self_attn.v_proj": "input_layernorm", "mlp.gate_proj": "post_attention_layernorm",
           "mlp.up_proj": "post_attention_layernorm"}


def rechoose_codes(config: dict, weights: dict, tuned: dict, ids: list[int], damp: float = 0.01, beam: int = 8,
                   progress: bool = True) -> tuple[dict[str, CodebookWeight], int]:
    """PV-tuning's discrete step after a fine-tune: every linear's codes chosen again by error feedback
    (codebook_gptq.gptq_codes, act-order) with its fine-tuned codebooks and scales fixed, layer by layer through
    the re-coded model; the new codes are kept where they lower the layer's output error tr(dW H dW^T).
    tuned: HF name -> the fine-tuned CodebookWeight of every linear and float norm weight. The fine-tuned norms
    move each normed linear's inputs, so its target is the float weight times norm_float / norm_tuned per input.
    Returns (HF name -> CodebookWeight, how many linears took new codes)."""
    from lowbit.formats.codebook_gptq import gptq_codes, output_error

    eff = {**weights, **{n: v for n, v in tuned.items() if not isinstance(v, CodebookWeight)}}
    for name, pw in tuned.items():
        if not isinstance(pw, CodebookWeight):
            continue
        prefix, module, proj, _ = name.rsplit(".", 3)  # model.layers.3 self_attn q_proj weight
        lin = f"{module}.{proj}"
        if lin in NORM_OF:
            norm = f"{prefix}.{NORM_OF[lin]}.weight"
            orig, new = np.asarray(weights[norm], np.float64), np.asarray(tuned.get(norm, weights[norm]), np.float64)
            ratio = np.divide(orig, new, out=np.zeros_like(orig), where=np.abs(new) > 1e-8)
            eff[name] = (np.asarray(weights[name], np.float64) * ratio[None, :]).astype(np.float32)
    changed = 0

    def one(name, w, h):
        nonlocal changed
        old = tuned[name]
        scales = old.scales()
        idx, _ = gptq_codes(w, h, old._cb, old.group, beam, damp, act_order=True, scales=scales)
        new = CodebookWeight.from_parts(idx, scales, old.codebooks, old.group, k=old.shape[1], **old.meta_extra)
        if output_error(w, new.dequantize(), h) < output_error(w, old.dequantize(), h):
            changed += 1
            return new
        return old

    out = quantize_sequential(config, eff, ids, {}, damp=damp, progress=progress, quantize_one=one,
                              desc="codebook codes again (PV)")
    return out, changed


def trainable(student: TorchLlama) -> list[torch.nn.Parameter]:
    """Codebooks, scales, norms: the parameters the fine-tune moves (everything else is frozen)."""
    params = []
    for lin in student.codebook_linears().values():
        params += [lin.books, lin.scales]
    for blk in student.blocks:
        params += [blk.ln1, blk.ln2]
    params.append(student.norm_w)
    return params


def kd_loss(student: TorchLlama, teacher: TorchLlama, batch: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(teacher || student) of the next-token distributions. batch [B, T]."""
    with torch.no_grad():
        t = F.log_softmax(teacher(batch), dim=-1)
    s = F.log_softmax(student(batch), dim=-1)
    return (t.exp() * (t - s)).sum(-1).mean()


def lr_factor(step: int, steps: int, warmup: int, schedule: str) -> float:
    """The learning rate's multiplier at `step` (0-based) of `steps`: linear warm-up over `warmup` steps, then
    constant or a cosine down to 0 at the last step."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    span = max(steps - warmup, 1)
    return 0.5 * (1.0 + np.cos(np.pi * (step - warmup) / span))


def window(data: torch.Tensor, more: list[torch.Tensor], seq: int, extra_frac: float,
           gen: torch.Generator) -> torch.Tensor:
    """One training window [<= seq]: from a random one of `more` with probability extra_frac, else from data."""
    src = data
    if float(torch.rand((), generator=gen)) < extra_frac:
        src = more[int(torch.randint(0, len(more), (), generator=gen))]
    n = min(seq, len(src))
    s = int(torch.randint(0, len(src) - n + 1, (), generator=gen))
    return src[s:s + n]


def finetune(student: TorchLlama, teacher: TorchLlama, ids: list[int], steps: int, seq: int = 256, batch: int = 1,
             lr: float = 1e-3, seed: int = 0, progress: bool = True, schedule: str = "constant", warmup: int = 0,
             extra: list[list[int]] | None = None, extra_frac: float = 0.0, on_step=None, pv_every: int = 0,
             pv_tau: float = 1e-3, pv_alpha: float = 0.2, pv_check: int = 2, pv_log: list | None = None) -> list[float]:
    """Trains student's codebooks, scales and norms towards teacher on windows of ids; returns the KD loss of
    each step (before its update). lr is relative: each tensor's Adam step size is lr times its RMS, times
    lr_factor(schedule, warmup). extra: more token sequences (e.g. kd_data.teacher_samples); each window comes from
    one of them with probability extra_frac (a seeded draw per step), else from ids. on_step(steps done, student)
    is called after every step (e.g. to save a checkpoint).
    pv_every: every that many steps, PV-tuning's discrete step with the end-to-end gradient (codebook_pv): the
    codes of the pv_tau fraction of all vectors with the largest predicted KD-loss decrease move to the centroid
    nearest the Adam-like target W - a*g (g: the mean dL/dW since the last such step, a = pv_alpha * rms(W) / the
    RMS of each weight's gradient over those steps); with pv_check > 0 windows (drawn under seed + 1000), a line
    search: pv_tau, pv_tau/4, pv_tau/16, the first that lowers their KD loss is kept (else none). Each step's record
    (codebook_pv.discrete_step) is appended to pv_log."""
    from tqdm.auto import tqdm

    if steps < 0 or seq < 2 or batch < 1 or warmup < 0:
        raise ValueError(f"finetune needs steps >= 0, seq >= 2, batch >= 1, warmup >= 0 (got {steps}, {seq}, {batch}, "
                         f"{warmup})")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"unknown fine-tune schedule {schedule!r}; choose constant or cosine")
    if pv_every < 0 or pv_check < 0 or (pv_every and (not 0.0 < pv_tau <= 1.0 or pv_alpha <= 0)):
        raise ValueError(f"the PV step needs pv_every >= 0, pv_check >= 0, 0 < pv_tau <= 1, pv_alpha > 0 (got "
                         f"{pv_every}, {pv_check}, {pv_tau}, {pv_alpha})")
    if not 0.0 <= extra_frac <= 1.0:
        raise ValueError(f"extra_frac must be in [0, 1], got {extra_frac}")
    extra = [e for e in (extra or []) if len(e) >= 2]
    if extra_frac and not extra:
        raise ValueError("extra_frac > 0 needs extra sequences of at least 2 tokens")
    seq = min(seq, len(ids))
    if seq < 2:
        raise ValueError("the calibration text is too short to fine-tune on (needs at least 2 tokens)")
    for p in student.parameters():
        p.requires_grad_(False)
    for p in teacher.parameters():
        p.requires_grad_(False)
    params = trainable(student)
    for p in params:
        p.requires_grad_(True)
    # one group per tensor, its step size relative to the tensor's RMS (scales ~1e-2, codebooks and norms ~1)
    base = [lr * max(float(p.detach().pow(2).mean().sqrt()), 1e-8) for p in params]
    opt = torch.optim.Adam([{"params": [p], "lr": b} for p, b in zip(params, base)])
    gen = torch.Generator().manual_seed(int(seed))
    data = torch.tensor(ids, dtype=torch.long)
    more = [torch.tensor(e, dtype=torch.long) for e in extra]
    check = []
    if pv_every:
        from lowbit.io.codebook_pv import discrete_step, track_weight_grads

        track_weight_grads(student)
        cgen = torch.Generator().manual_seed(int(seed) + 1000)
        check = [window(data, more, seq, extra_frac if more else 0.0, cgen)[None] for _ in range(pv_check)]
    losses = []
    bar = tqdm(range(steps), desc="codebook fine-tune (KD)", unit="step", disable=not progress)
    for step in bar:
        f = lr_factor(step, steps, warmup, schedule)
        for group, b in zip(opt.param_groups, base):
            group["lr"] = b * f
        if not extra_frac:  # the windows of the calibration text alone (as before extra data existed)
            starts = torch.randint(0, len(ids) - seq + 1, (batch,), generator=gen)
            loss = kd_loss(student, teacher, torch.stack([data[s:s + seq] for s in starts.tolist()]))
        else:
            rows = [window(data, more, seq, extra_frac, gen) for _ in range(batch)]
            loss = sum(kd_loss(student, teacher, r[None]) * r.numel() for r in rows) / sum(r.numel() for r in rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        bar.set_postfix_str(f"KL {losses[-1]:.4f}", refresh=False)
        if pv_every and (step + 1) % pv_every == 0:
            rec = discrete_step(student, teacher, pv_tau, pv_alpha, check, step + 1)
            if pv_log is not None:
                pv_log.append(rec)
        if on_step is not None:
            on_step(step + 1, student)
    for p in params:
        p.requires_grad_(False)
    if pv_every:
        from lowbit.io.codebook_pv import untrack_weight_grads

        untrack_weight_grads(student)
    return losses


def tune_model(ckpt, text: str, tokens: int, options: dict, error_feedback: bool, damp: float, steps: int,
               finetune_options: dict, lm_head_format: str, progress: bool = True, log: dict | None = None) -> dict:
    """convert()'s codebook path with the whole model in memory: HF name -> CodebookWeight for every decoder
    linear (with error feedback, or calibrated by the diagonal statistics) and, after `steps` of fine-tuning,
    the fine-tuned float32 norm weights too. log: filled by tune() (the held-out KL)."""
    from lowbit.io.calibrate import calibration_ids
    from lowbit.io.checkpoint import EMBED, LM_HEAD, is_linear
    from lowbit.io.torch_llama import check_llama, dense

    config = dict(ckpt.config)
    check_llama(config)
    ids = calibration_ids(ckpt, text, tokens)
    weights = {name: dense(ckpt.load(name)) for name in ckpt.tensor_names()}
    if error_feedback:
        out = quantize_sequential(config, weights, ids, options, damp=damp, progress=progress)
    else:
        from lowbit.io.calibrate import activation_stats

        stats = activation_stats(ckpt, text, tokens=tokens)
        out = {name: CodebookWeight.quantize(w, **options, importance=stats[name])
               for name, w in weights.items() if is_linear(name)}
    if steps or finetune_options.get("pv_steps"):
        from lowbit.io.convert import pack

        head = pack(weights.get(LM_HEAD, weights[EMBED]), lm_head_format).dequantize()
        out = tune(config, weights, ckpt.tokenizer(), ids, out, head, steps,
                   {"seed": options.get("seed", 0), **finetune_options}, damp, options.get("beam", 8), progress,
                   log=log)[0]
    return out


def heldout_kl(student: TorchLlama, teacher: TorchLlama, ids: list[int], seq: int) -> float:
    """Mean KL(teacher || student) per token over consecutive windows of ids (at most seq tokens, >= 2 each)."""
    total, n = 0.0, 0
    with torch.no_grad():
        for w in windows(ids, seq):
            total += float(kd_loss(student, teacher, w)) * (w.shape[1] - 1)
            n += w.shape[1] - 1
    return total / max(n, 1)


def tune(config: dict, weights: dict, tokenizer, ids: list[int], start: dict, head, steps: int,
         finetune_options: dict, damp: float = 0.01, beam: int = 8, progress: bool = True,
         log: dict | None = None, on_step=None) -> tuple[dict, list[float]]:
    """The fine-tune of a quantized model: start (HF name -> CodebookWeight of every linear, and optionally
    fine-tuned float norms) -> the same names and every norm, trained `steps` towards the float `weights` on the
    calibration tokens ids, with the int8 lm_head `head` [vocab, hidden]; and the KD loss of every step.
    finetune_options: finetune()'s (seq, batch, lr, seed, schedule, warmup, extra_frac), plus
      teacher_tokens, teacher_len: that many tokens sampled from the teacher (kd_data.teacher_samples, in
        sequences of teacher_len), the windows drawn from them with probability extra_frac;
      pv_steps: after the fine-tune, PV-tuning's discrete step (rechoose_codes) and pv_steps more steps;
      pv_every, pv_tau, pv_alpha, pv_check: finetune()'s discrete step with the end-to-end gradient, inside the
        fine-tune (its records go to log["pv"]);
      holdout: the last `holdout` calibration tokens are left out of the training (and of the teacher-sample
        prompts); the KL on them before and after each stage goes to log["holdout_kl"] as [[steps done, KL], ...]
        (printed with progress): a rising value means the fine-tune overfits the calibration text."""
    from lowbit.io.kd_data import teacher_samples

    opts = dict(finetune_options)
    n_extra, length = int(opts.pop("teacher_tokens", 0)), int(opts.pop("teacher_len", 128))
    pv_steps = int(opts.pop("pv_steps", 0))
    n_hold = int(opts.pop("holdout", 0))
    hold = []
    if n_hold:
        if n_hold < 2 or len(ids) - n_hold < 2:
            raise ValueError(f"holdout needs 2 <= holdout <= calibration tokens - 2 (got {n_hold} of {len(ids)} "
                             "tokens)")
        ids, hold = ids[:-n_hold], ids[-n_hold:]
    record = log if log is not None else {}
    extra = []
    if n_extra and (steps or pv_steps):
        extra = teacher_samples(config, weights, tokenizer, ids, n_extra, length=length, seed=opts.get("seed", 0),
                                progress=progress)
    if not extra:
        opts["extra_frac"] = 0.0
    teacher = TorchLlama(config, weights)
    losses = []

    def check(student: TorchLlama) -> None:
        if hold:
            kl = heldout_kl(student, teacher, hold, opts.get("seq", 256))
            record.setdefault("holdout_kl", []).append([len(losses), kl])
            if progress:
                print(f"codebook fine-tune: held-out KL {kl:.4f} after {len(losses)} steps ({len(hold)} tokens)")

    def stage(tuned: dict, n: int) -> dict:
        student = TorchLlama(config, {**weights, **tuned}, lm_head=head)
        check(student)
        done = len(losses)
        hook = None if on_step is None else (lambda k, st: on_step(done + k, st))
        pv = record.setdefault("pv", []) if opts.get("pv_every") else None
        losses.extend(finetune(student, teacher, ids, n, progress=progress, extra=extra, on_step=hook, pv_log=pv,
                               **opts))
        if pv and progress:
            print(f"codebook PV steps (end-to-end gradient): {sum(r['kept'] for r in pv)} of {len(pv)} kept, "
                  f"{sum(r['changed'] for r in pv)} vectors recoded")
        check(student)
        return {**{name: lin.packed() for name, lin in student.codebook_linears().items()}, **student.norms()}

    tuned = stage(dict(start), steps)
    if pv_steps:
        tuned, changed = rechoose_codes(config, weights, tuned, ids, damp, beam, progress)
        if progress:
            n_lin = sum(isinstance(v, CodebookWeight) for v in tuned.values())
            print(f"codebook PV step: new codes in {changed} of {n_lin} linears")
        tuned = stage(tuned, pv_steps)
    return tuned, losses


def finetune_dir(model_dir, source, out, text: str, tokens: int, steps: int, finetune_options: dict,
                 progress: bool = True, overwrite: bool = False, save_every: int = 0):
    """Fine-tunes an existing codebook model directory again (its codes kept) towards its float source and writes
    the result to out: every other tensor is copied as it is. For experiments: a fine-tune without redoing the
    error feedback (convert() with finetune_steps=0 first). save_every: also write the model after every that many
    steps to `out`-STEP (e.g. out-100), to read a long fine-tune partway."""
    from lowbit.io.calibrate import calibration_ids
    from lowbit.io.checkpoint import LM_HEAD, open_checkpoint
    from lowbit.io.modeldir import LowbitCheckpoint, ModelDirWriter
    from lowbit.io.torch_llama import check_llama, dense

    if save_every < 0:
        raise ValueError(f"save_every must be >= 0, got {save_every}")
    ck = LowbitCheckpoint(model_dir)
    src = open_checkpoint(source)
    config = dict(src.config)
    check_llama(config)
    names = ck.tensor_names()
    mine = {name: ck.load(name) for name in names}
    if not any(isinstance(v, CodebookWeight) for v in mine.values()):
        raise ValueError(f"{model_dir}: no codebook weights to fine-tune")
    ids = calibration_ids(src, text, tokens)
    weights = {name: dense(src.load(name)) for name in src.tensor_names()}
    start = {n: v for n, v in mine.items() if isinstance(v, CodebookWeight)}
    start.update({n: dense(v) for n, v in mine.items() if "norm" in n})
    fmt = ck.lowbit.get("format_options") or {}
    log = {}

    def write(path, tuned: dict, n: int) -> None:
        meta = dict(ck.lowbit)
        meta.pop("tensors", None)
        meta.pop("version", None)
        meta["finetune_again"] = {"from": str(model_dir), "steps": n, **finetune_options, **log}
        with ModelDirWriter(path, overwrite=overwrite) as writer:
            for name in names:
                writer.add(name, tuned.get(name, mine[name]))
            writer.finish(dict(ck.config), ck.tokenizer(), meta)

    def checkpoint(n: int, student: TorchLlama) -> None:
        if save_every and n % save_every == 0 and n < steps:
            write(f"{out}-{n}", {**{k: lin.packed() for k, lin in student.codebook_linears().items()},
                                 **student.norms()}, n)

    done, losses = tune(config, weights, src.tokenizer(), ids, start, dense(mine[LM_HEAD]), steps, finetune_options,
                        (ck.lowbit.get("error_feedback") or {}).get("damp", 0.01), fmt.get("beam", 8), progress, log,
                        on_step=checkpoint)
    del weights
    write(out, done, steps)
    return losses
