"""A minimal Llama in torch (float32, CPU) for codebook calibration and fine-tuning: the math of
lowbit.model.llama (HF rotate-half RoPE, grouped-query attention, SiLU MLP, RMSNorm), with every decoder
linear either a frozen dense matrix or a CodebookLinear (codes frozen; codebooks and scales trainable).

    net = TorchLlama(config, weights)          # weights: HF name -> float32 array (or PackedWeight)
    logits = net(torch.tensor([[1, 2, 3]]))    # [B, T, vocab]

Only plain Llama-family models (lowbit.model.llama.Model: no biases, no sub-norms, SiLU); others raise.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lowbit.formats import PackedWeight
from lowbit.formats.codebook import CodebookWeight
from lowbit.io.checkpoint import EMBED, FINAL_NORM, LM_HEAD
from lowbit.model.config import ModelArgs
from lowbit.model.layers import rope_inv_freq

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def check_llama(config: dict) -> ModelArgs:
    """The config's ModelArgs if TorchLlama implements it, else ValueError naming what it lacks."""
    from lowbit.model import get_model_class
    from lowbit.model.llama import Model as Llama

    a = ModelArgs.from_config(config)
    if get_model_class(a.model_type) is not Llama:
        raise ValueError(f"codebook error feedback / fine-tuning supports Llama-family models, not {a.model_type!r}")
    if a.attention_bias or a.mlp_bias or a.hidden_act != "silu":
        raise ValueError("codebook error feedback / fine-tuning supports Llama models without biases and with SiLU")
    return a


def dense(value) -> np.ndarray:
    return value.dequantize() if isinstance(value, PackedWeight) else np.asarray(value, np.float32)


class DenseLinear(nn.Module):
    """A frozen float32 matrix [M, K]."""

    def __init__(self, w: np.ndarray):
        super().__init__()
        self.register_buffer("w", torch.from_numpy(np.ascontiguousarray(w, np.float32)))

    def weight(self) -> torch.Tensor:
        return self.w

    def forward(self, x):
        return F.linear(x, self.w)


class CodebookLinear(nn.Module):
    """w[r, k] = scales[r, k // g] * sum_i books[i, codes[r, k // v, i], k % v]; codes frozen (a buffer)."""

    def __init__(self, pw: CodebookWeight):
        super().__init__()
        self.shape, self.group, self.kp, self.meta = pw.shape, pw.group, pw.kp, dict(pw.meta_extra)
        # [M, nseg, m] uint8 (b <= 8): a quarter of int32, an eighth of int64; widened per use in weight()
        self.register_buffer("codes", torch.from_numpy(np.ascontiguousarray(pw.unpacked_codes(), np.uint8)))
        self.books = nn.Parameter(torch.from_numpy(np.array(pw._cb, np.float32)))  # [m, 2^b, v]
        self.scales = nn.Parameter(torch.from_numpy(pw.scales()))  # [M, G]
        # [M, K] float32 each: every backward adds dL/dW and (dL/dW)^2 here when set (codebook_pv's PV step)
        self.grad_sum = self.grad_sq = None
        self.grad_n = 0

    def weight(self) -> torch.Tensor:
        m = self.books.shape[0]
        vec = F.embedding(self.codes[..., 0].int(), self.books[0])  # [M, nseg, v]
        for i in range(1, m):
            vec = vec + F.embedding(self.codes[..., i].int(), self.books[i])
        rows, groups = self.scales.shape
        # scales broadcast over each group (not repeated to [M, Kp]: autograd would keep that copy too)
        vec = F.pad(vec.reshape(rows, self.kp), (0, groups * self.group - self.kp)).view(rows, groups, self.group)
        return (vec * self.scales[:, :, None]).view(rows, groups * self.group)[:, :self.shape[1]]

    def forward(self, x):
        w = self.weight()
        if self.grad_sum is not None and w.requires_grad:
            w.register_hook(self._add_grad)
        return F.linear(x, w)

    def _add_grad(self, g):
        self.grad_sum.add_(g)
        self.grad_sq.addcmul_(g, g)
        self.grad_n += 1

    def packed(self) -> CodebookWeight:
        """The trained parameters, float16-rounded, with the original codes."""
        books = self.books.detach().numpy().astype(np.float16)
        scales = self.scales.detach().numpy().astype(np.float16)
        return CodebookWeight.from_parts(self.codes.numpy().copy(), scales, books, self.group,
                                         k=self.shape[1], **self.meta)


def make_linear(value) -> nn.Module:
    return CodebookLinear(value) if isinstance(value, CodebookWeight) else DenseLinear(dense(value))


class Block(nn.Module):
    def __init__(self, a: ModelArgs, weights, i: int):
        super().__init__()
        p = f"model.layers.{i}."
        self.lin = nn.ModuleDict({n.replace(".", "_"): make_linear(weights[p + n + ".weight"]) for n in LINEARS})
        self.ln1 = nn.Parameter(torch.from_numpy(dense(weights[p + "input_layernorm.weight"]).copy()))
        self.ln2 = nn.Parameter(torch.from_numpy(dense(weights[p + "post_attention_layernorm.weight"]).copy()))
        self.heads, self.kv, self.hd, self.eps = a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.rms_norm_eps

    def __getitem__(self, name: str) -> nn.Module:
        return self.lin[name.replace(".", "_")]

    def set_linear(self, name: str, module: nn.Module) -> None:
        self.lin[name.replace(".", "_")] = module

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def attend(self, h, cos, sin):
        """h: normed input [B, T, hidden] -> the attention output before o_proj [B, T, heads*hd]."""
        b, t, _ = h.shape
        q = self["self_attn.q_proj"](h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self["self_attn.k_proj"](h).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self["self_attn.v_proj"](h).view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(b, t, self.heads * self.hd)

    def mlp_act(self, h):
        """h: normed input -> silu(gate(h)) * up(h) [B, T, inter]."""
        return F.silu(self["mlp.gate_proj"](h)) * self["mlp.up_proj"](h)

    def forward(self, x, cos, sin):
        x = x + self["self_attn.o_proj"](self.attend(self.norm(x, self.ln1), cos, sin))
        return x + self["mlp.down_proj"](self.mlp_act(self.norm(x, self.ln2)))


def rope(x, cos, sin):
    """x [B, H, T, hd], cos/sin [T, hd] ([cos, cos], [-sin, sin]) -> x*cos + swap_halves(x)*sin."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., h:], x[..., :h]), dim=-1) * sin


class TorchLlama(nn.Module):
    def __init__(self, config: dict, weights, lm_head=None):
        """weights: HF name -> float array or PackedWeight (CodebookWeight linears become CodebookLinear);
        lm_head: the output matrix to use instead of weights' (e.g. the quantized one the model will keep)."""
        super().__init__()
        a = check_llama(config)
        self.args = a
        self.register_buffer("embed", torch.from_numpy(dense(weights[EMBED])))
        head = lm_head if lm_head is not None else weights.get(LM_HEAD, weights[EMBED])
        self.head = DenseLinear(dense(head))
        self.blocks = nn.ModuleList(Block(a, weights, i) for i in range(a.num_hidden_layers))
        self.norm_w = nn.Parameter(torch.from_numpy(dense(weights[FINAL_NORM]).copy()))
        inv = rope_inv_freq(a.head_dim, a.rope_theta, a.rope_scaling, a.rope_freq_factors)
        self.inv_freq = torch.from_numpy(np.asarray(inv, np.float32))

    def rope_tables(self, t: int):
        f = torch.outer(torch.arange(t, dtype=torch.float32), self.inv_freq)
        cos, sin = torch.cos(f), torch.sin(f)
        return torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)

    def hidden(self, ids) -> torch.Tensor:
        """ids LongTensor [B, T] -> final-normed hidden states [B, T, hidden]."""
        cos, sin = self.rope_tables(ids.shape[1])
        x = self.embed[ids]
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.args.rms_norm_eps) * self.norm_w

    def forward(self, ids) -> torch.Tensor:
        return self.head(self.hidden(ids))

    def codebook_linears(self) -> dict[str, CodebookLinear]:
        """HF weight name -> CodebookLinear, for every codebook decoder linear."""
        out = {}
        for i, blk in enumerate(self.blocks):
            for n in LINEARS:
                if isinstance(blk[n], CodebookLinear):
                    out[f"model.layers.{i}.{n}.weight"] = blk[n]
        return out

    def norms(self) -> dict[str, np.ndarray]:
        """HF name -> float32 copy of every norm weight."""
        out = {FINAL_NORM: self.norm_w.detach().numpy().copy()}
        for i, blk in enumerate(self.blocks):
            out[f"model.layers.{i}.input_layernorm.weight"] = blk.ln1.detach().numpy().copy()
            out[f"model.layers.{i}.post_attention_layernorm.weight"] = blk.ln2.detach().numpy().copy()
        return out
