#!/usr/bin/env python3
"""An independent Llama in Python: the check and the speed peer of the C++ `llama` model.

Written from the published architecture (Meta's llama/model.py for Llama 2/3: RMSNorm, rotary
embeddings as complex rotations of interleaved pairs via torch.polar / view_as_complex,
grouped-query attention by repeat_kv, SwiGLU feed-forward, untied or tied output), and, for
Hugging Face directories, transformers' LlamaForCausalLM convention (rotate_half pairs i with
i + hd/2; GPT2LMHeadModel's Conv1D computes x @ W + b). It reads the C++ code's files, never its code.

Modes (one JSON line on stdout each):
  --check DIR...  each DIR: config.json (HF fields), weights.safetensors (our torchtitan names;
                llama only), hf.safetensors (the Hugging Face export of the same weights),
                expected.safetensors (idx, targets, logits, loss, grad_norm from the C++ model).
                Recomputes them in fp32 on CPU from each weights file; exit 1 when the logits differ
                by 1e-4 or more (max abs), or the loss / gradient norm by a relative 1e-4 or more.
  --bench       random tokens, AdamW steps on the given shape; prints tokens/s (the C++ side runs
                in the same script, bench/llama_vs_peer.sh).
Works with PyTorch 1.13 (CPU) and 2.x.
"""
import argparse, json, math, struct, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
          "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    """The safetensors format: u64 header length, JSON header, raw little-endian data."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        raw = bytearray(blob[8 + n + lo:8 + n + hi])
        t = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]) if hi > lo else torch.empty(0, dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__(); self.eps = eps; self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def precompute_freqs_cis(dim, end, theta):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device).float()
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs))  # complex64 (end, dim/2)


def apply_rotary_meta(xq, xk, freqs_cis):
    """Meta: consecutive pairs (2i, 2i+1) are one complex number, multiplied by e^{i t w_i}."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    fc = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * fc).flatten(3).type_as(xq), torch.view_as_real(xk_ * fc).flatten(3).type_as(xk)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_hf(xq, xk, freqs_cis):
    """transformers: cos/sin of the angles repeated over both halves, x * cos + rotate_half(x) * sin."""
    ang = torch.angle(freqs_cis)
    emb = torch.cat((ang, ang), dim=-1)  # (T, hd)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    return xq * cos + rotate_half(xq) * sin, xk * cos + rotate_half(xk) * sin


def repeat_kv(x, n_rep):
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, n_kv_heads * n_rep, head_dim)


class Attention(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n_heads, self.n_kv_heads = a["num_attention_heads"], a["num_key_value_heads"]
        self.head_dim = a["hidden_size"] // self.n_heads
        d = a["hidden_size"]
        self.wq = nn.Linear(d, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        self.rotary = apply_rotary_meta

    def forward(self, x, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = self.rotary(xq, xk, freqs_cis)
        keys = repeat_kv(xk, self.n_heads // self.n_kv_heads)
        values = repeat_kv(xv, self.n_heads // self.n_kv_heads)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        out = torch.matmul(scores, values).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.attention = Attention(a)
        self.feed_forward = FeedForward(a["hidden_size"], a["intermediate_size"])
        self.attention_norm = RMSNorm(a["hidden_size"], a["rms_norm_eps"])
        self.ffn_norm = RMSNorm(a["hidden_size"], a["rms_norm_eps"])

    def forward(self, x, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tie = a.get("tie_word_embeddings", False)
        self.tok_embeddings = nn.Embedding(a["vocab_size"], a["hidden_size"])
        self.layers = nn.ModuleList(TransformerBlock(a) for _ in range(a["num_hidden_layers"]))
        self.norm = RMSNorm(a["hidden_size"], a["rms_norm_eps"])
        if not self.tie:
            self.output = nn.Linear(a["hidden_size"], a["vocab_size"], bias=False)
        hd = a["hidden_size"] // a["num_attention_heads"]
        self.freqs_cis = precompute_freqs_cis(hd, a["max_position_embeddings"], a["rope_theta"])

    def forward(self, tokens):
        _, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        mask = torch.triu(torch.full((seqlen, seqlen), float("-inf")), diagonal=1)
        for layer in self.layers:
            h = layer(h, self.freqs_cis[:seqlen], mask)
        h = self.norm(h)
        return F.linear(h, self.tok_embeddings.weight) if self.tie else self.output(h)


# transformers' LlamaForCausalLM names -> the Meta/torchtitan names of the modules above.
HF_LLAMA = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
            "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
            "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
            "post_attention_layernorm": "ffn_norm"}


def llama_from_hf_names(w):
    out = {}
    for k, v in w.items():
        if k == "model.embed_tokens.weight": out["tok_embeddings.weight"] = v
        elif k == "model.norm.weight": out["norm.weight"] = v
        elif k == "lm_head.weight": out["output.weight"] = v
        else:
            parts = k.split(".")  # model.layers.I.<module path>.weight
            out["layers.%s.%s.weight" % (parts[2], HF_LLAMA[".".join(parts[3:-1])])] = v
    return out


class GPT2(nn.Module):
    """transformers' GPT2LMHeadModel, from its published layout: Conv1D weights are (in, out)."""
    def __init__(self, a, w):
        super().__init__()
        self.a, self.w = a, {k: nn.Parameter(v) for k, v in w.items()}
        for i, (k, p) in enumerate(self.w.items()):
            self.register_parameter("p%d" % i, p)

    def conv1d(self, x, name):
        return torch.addmm(self.w[name + ".bias"], x.reshape(-1, x.shape[-1]), self.w[name + ".weight"]).view(*x.shape[:-1], -1)

    def forward(self, tokens):
        a, w = self.a, self.w
        T, d, H = tokens.shape[1], a["n_embd"], a["n_head"]
        ln = lambda x, n: F.layer_norm(x, (d,), w[n + ".weight"], w[n + ".bias"], a["layer_norm_epsilon"])
        h = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][:T]
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        for i in range(a["n_layer"]):
            p = "transformer.h.%d." % i
            q, k, v = self.conv1d(ln(h, p + "ln_1"), p + "attn.c_attn").split(d, dim=2)
            q, k, v = [t.view(t.shape[0], T, H, d // H).transpose(1, 2) for t in (q, k, v)]
            att = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // H) + mask, dim=-1) @ v
            h = h + self.conv1d(att.transpose(1, 2).reshape(h.shape), p + "attn.c_proj")
            m = self.conv1d(ln(h, p + "ln_2"), p + "mlp.c_fc")
            h = h + self.conv1d(F.gelu(m, approximate="tanh"), p + "mlp.c_proj")
        return F.linear(ln(h, "transformer.ln_f"), w["transformer.wte.weight"])


def build(cfg, weights, hf):
    if cfg["model_type"] == "gpt2":
        return GPT2(cfg, weights)
    m = Transformer(cfg)
    if hf:
        weights = llama_from_hf_names(weights)
        for layer in m.layers:
            layer.attention.rotary = apply_rotary_hf
    m.load_state_dict(weights, strict=True)
    return m


def check_one(d, weights, hf):
    cfg = json.load(open(d + "/config.json"))
    exp = read_safetensors(d + "/expected.safetensors")
    m = build(cfg, read_safetensors(d + "/" + weights), hf)
    logits = m(exp["idx"])
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), exp["targets"].view(-1), ignore_index=-1)
    loss.backward()
    gnorm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in m.parameters() if p.grad is not None)).item()
    r = {"case": d, "weights": weights, "model_type": cfg["model_type"],
         "logits_max_abs_diff": (logits.detach() - exp["logits"]).abs().max().item(),
         "loss": loss.item(), "loss_cpp": exp["loss"].item(), "grad_norm": gnorm, "grad_norm_cpp": exp["grad_norm"].item()}
    r["loss_rel_diff"] = abs(r["loss"] - r["loss_cpp"]) / abs(r["loss_cpp"])
    r["grad_norm_rel_diff"] = abs(gnorm - r["grad_norm_cpp"]) / r["grad_norm_cpp"]
    r["ok"] = r["logits_max_abs_diff"] < 1e-4 and r["loss_rel_diff"] < 1e-4 and r["grad_norm_rel_diff"] < 1e-4
    print(json.dumps(r))
    return r["ok"]


def check(dirs):
    """Each DIR: our names (llama) and the Hugging Face export (both archs) against the C++ outputs."""
    ok = True
    for d in dirs:
        if json.load(open(d + "/config.json"))["model_type"] == "llama":
            ok = check_one(d, "weights.safetensors", False) and ok
        ok = check_one(d, "hf.safetensors", True) and ok
    return 0 if ok else 1


def bench(a):
    cfg = {"num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads or a.heads, "hidden_size": a.dim,
           "intermediate_size": a.ffn, "num_hidden_layers": a.layers, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "vocab_size": a.vocab, "max_position_embeddings": a.seq, "tie_word_embeddings": False}
    torch.manual_seed(0)
    m = Transformer(cfg)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    n_params = sum(p.numel() for p in m.parameters())
    x = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    for i in range(a.warmup + a.steps):
        if i == a.warmup: t0 = time.perf_counter()
        logits = m(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "llama_peer.py", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "params": n_params, "tokens_per_s": round(a.steps * a.batch * a.seq / dt, 1),
                      "step_ms": round(1e3 * dt / a.steps, 2), "final_loss": round(loss.item(), 4)}))
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check", nargs="+", metavar="DIR")
    p.add_argument("--bench", action="store_true")
    for k, v in {"layers": 4, "heads": 4, "kv_heads": 0, "dim": 256, "ffn": 768, "seq": 128, "vocab": 4096,
                 "batch": 16, "steps": 10, "warmup": 3, "threads": 0}.items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    a = p.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    if a.check: return check(a.check)
    if a.bench: return bench(a)
    p.error("--check DIR or --bench")


if __name__ == "__main__":
    sys.exit(main())
