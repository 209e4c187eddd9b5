"""Probe of the end-to-end PV step (io/codebook_pv) on a fine-tuned codebook model: the dL/dW of N training
windows, then for each alpha and fraction tau the KD-loss change of the step on 4 of those windows (in-sample)
and on 4 other windows (out-of-sample). --curvature fisher: the library's a_j = alpha rms(W) / rms_steps(g_j);
kfac: a = alpha / F with F[r, k] = T^2 E_t[dL/dy_r^2] E_t[x_k^2] per token (not in the library: it did worse).

    OMP_NUM_THREADS=1 python scripts/codebook_pv_probe.py MODEL_DIR GGUF calib.txt calib2.txt TEACHER.json 16 0.05,0.2
(TEACHER.json: the teacher samples of the fine-tune, a JSON list of token lists, e.g. kd_data.teacher_samples.)
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

import lowbit.io.codebook_pv as pv
from lowbit.formats.codebook import CodebookWeight
from lowbit.io.checkpoint import LM_HEAD, open_checkpoint
from lowbit.io.codebook_pv import apply_plan, plan, restore_codes, track_weight_grads
from lowbit.io.codebook_tune import kd_loss, window
from lowbit.io.modeldir import LowbitCheckpoint
from lowbit.io.torch_llama import CodebookLinear, TorchLlama, dense

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("model"); ap.add_argument("source"); ap.add_argument("calib"); ap.add_argument("calib2")
ap.add_argument("teacher_json"); ap.add_argument("n", type=int); ap.add_argument("alphas")
ap.add_argument("--curvature", choices=["fisher", "kfac"], default="fisher")
ap.add_argument("--taus", default="1e-3,1e-4,1e-5")
args = ap.parse_args()
torch.set_num_threads(1)
t0 = time.time()
src = open_checkpoint(args.source)
config, tok = dict(src.config), src.tokenizer()
w = {n: dense(src.load(n)) for n in src.tensor_names()}
enc = lambda s: [int(i) for i in tok.encode(s, add_bos=False)]  # noqa: E731
ids = enc(open(args.calib).read()) + enc(open(args.calib2).read())[:-1024]  # the third session's held-out tail
extra = json.load(open(args.teacher_json))
ck = LowbitCheckpoint(args.model)
mine = {n: ck.load(n) for n in ck.tensor_names()}
start = {n: v for n, v in mine.items() if isinstance(v, CodebookWeight)}
start.update({n: dense(v) for n, v in mine.items() if "norm" in n})
teacher = TorchLlama(config, w)
student = TorchLlama(config, {**w, **start}, lm_head=dense(mine[LM_HEAD]))
for p in list(student.parameters()) + list(teacher.parameters()):
    p.requires_grad_(False)
for lin in student.codebook_linears().values():
    lin.books.requires_grad_(True)
data, more = torch.tensor(ids), [torch.tensor(e) for e in extra if len(e) >= 2]
gen = torch.Generator().manual_seed(99)
train = [window(data, more, 256, 0.5, gen)[None] for _ in range(args.n)]
test = [window(data, more, 256, 0.5, gen)[None] for _ in range(4)]
track_weight_grads(student)
stats = {}
if args.curvature == "kfac":
    def fwd(self, x):
        wt = self.weight()
        if self.grad_sum is None or not wt.requires_grad:
            return F.linear(x, wt)
        wt.register_hook(self._add_grad)
        st = stats.setdefault(id(self), [torch.zeros(self.shape[1]), torch.zeros(self.shape[0]), 0])
        x2 = x.detach().reshape(-1, x.shape[-1])
        st[0] += x2.pow(2).sum(0)
        st[2] += x2.shape[0]
        y = F.linear(x, wt)
        y.register_hook(lambda d, st=st: (st[1].add_(d.detach().reshape(-1, d.shape[-1]).pow(2).sum(0)), None)[1])
        return y
    CodebookLinear.forward = fwd

    def step_kfac(lin, alpha, T=256):
        n, v, kp = max(lin.grad_n, 1), lin.books.shape[2], lin.kp
        xs, ds, nt = stats[id(lin)]
        fis = (T * T) * torch.outer(ds / nt, xs / nt)
        fis = fis + 1e-6 * float(fis.mean())
        pad = (0, kp - lin.shape[1])
        g = F.pad(lin.grad_sum / n, pad).reshape(-1, v)
        a = F.pad(alpha / fis, pad, value=1.0).reshape(-1, v)
        s = lin.scales.detach().repeat_interleave(lin.group, dim=1)[:, :kp].reshape(-1, v)
        return g, a, s
    pv._step = step_kfac
for r in train:
    kd_loss(student, teacher, r).backward()
print(f"gradients of {args.n} windows: {time.time() - t0:.0f} s", flush=True)


def ev(ws):
    with torch.no_grad():
        return sum(float(kd_loss(student, teacher, r)) for r in ws) / len(ws)


base_in, base_out = ev(train[:4]), ev(test)
print(json.dumps({"base_in": base_in, "base_out": base_out}), flush=True)
for alpha in [float(x) for x in args.alphas.split(",")]:
    p = plan(student, max(float(t) for t in args.taus.split(",")), alpha)
    for tau in [float(t) for t in args.taus.split(",")]:
        st = apply_plan(student, p, max(1, int(tau * p["vectors"])))
        li, lo = ev(train[:4]), ev(test)
        restore_codes(student, st["undo"])
        print(json.dumps({"alpha": alpha, "tau": tau, "changed": st["changed"], "predicted_decrease": st["predicted"],
                          "in": li - base_in, "out": lo - base_out, "t": time.time() - t0}), flush=True)
