"""The loader's peers, written from data/format/FORMAT.md alone (the format's second implementation):
  --style dataloader: packed windows of seq_len+1 tokens read with numpy memmap and batched by a
                      torch.utils.data.DataLoader with --workers worker processes;
  --style getbatch:   nanoGPT's get_batch (train.py), in the training process: a fresh np.memmap
                      of the tokens, B random offsets, torch.from_numpy of int64 copies, stacked.
                      nanoGPT reads one train.bin; here each batch draws its shard in proportion
                      to its tokens, then runs get_batch on it (no EOS between documents: less
                      work than ours, which inserts them).

usage: /usr/bin/python3 bench/loader_peer.py DATA_DIR [--style S] [--workers N] [--seq T] [--batch B]
                                             [--batches N] [--warmup N]
Prints one JSON line: tokens/s and output bytes/s of (inputs, targets) int64 batches of (B, T).
"""
import argparse
import json
import struct
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Shard:
    """One shard file, memory-mapped (FORMAT.md, "Shard file")."""

    def __init__(self, path, info):
        with open(path, "rb") as f:
            magic, version, w, n_docs, n_tokens, index_off, tokens_off = struct.unpack("<8sIIQQQQ", f.read(48))
        assert magic == b"LMSHARD\0" and version == 1 and w in (2, 4), path
        assert n_docs == info["docs"] and n_tokens == info["tokens"], path
        self.offsets = np.memmap(path, "<u8", "r", index_off, (n_docs + 1,))
        self.tokens = np.memmap(path, "<u2" if w == 2 else "<u4", "r", tokens_off, (n_tokens,))
        # The stream appends EOS after every document: document i's EOS sits at offsets[i+1] + i.
        self.eos_pos = self.offsets[1:] + np.arange(n_docs, dtype=np.uint64)
        self.length = n_tokens + n_docs

    def read(self, q, n, eos):
        """Stream positions [q, q+n) of this shard."""
        pos = np.arange(q, q + n, dtype=np.uint64)
        doc = np.searchsorted(self.eos_pos, pos, "left")  # the document each position belongs to
        is_eos = self.eos_pos[doc] == pos
        idx = np.where(is_eos, 0, pos - doc.astype(np.uint64))
        return np.where(is_eos, eos, self.tokens[idx].astype(np.int64))


class PackedWindows(Dataset):
    """Window i = stream[i*T, i*T+T+1) of the split's documents joined by EOS, in manifest order."""

    def __init__(self, data_dir, split, seq_len):
        m = json.load(open(f"{data_dir}/manifest.json"))
        self.eos = m["tokenizer"]["eos_id"]
        self.shards = [Shard(f"{data_dir}/{s['file']}", s) for s in m["shards"] if s["split"] == split]
        self.starts = np.cumsum([0] + [s.length for s in self.shards])
        self.seq_len = seq_len
        self.n = (int(self.starts[-1]) - 1) // seq_len

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        pos, need, parts = i * self.seq_len, self.seq_len + 1, []
        s = int(np.searchsorted(self.starts, pos, "right")) - 1
        while need > 0:
            q = pos - int(self.starts[s])
            n = min(need, self.shards[s].length - q)
            if n > 0:
                parts.append(self.shards[s].read(q, n, self.eos))
                pos, need = pos + n, need - n
            s += 1
        w = torch.from_numpy(np.concatenate(parts))
        return w[:-1], w[1:]


class GetBatch:
    """nanoGPT's get_batch over the split's shards (see the module comment)."""

    def __init__(self, data_dir, split, seq_len, batch):
        m = json.load(open(f"{data_dir}/manifest.json"))
        self.shards = []
        for s in m["shards"]:
            if s["split"] != split:
                continue
            path = f"{data_dir}/{s['file']}"
            with open(path, "rb") as f:
                _, _, w, _, n_tokens, _, tokens_off = struct.unpack("<8sIIQQQQ", f.read(48))
            self.shards.append((path, np.uint16 if w == 2 else np.uint32, tokens_off, n_tokens))
        sizes = np.array([s[3] for s in self.shards], dtype=np.float64)
        self.p = sizes / sizes.sum()
        self.T, self.B = seq_len, batch

    def __next__(self):
        path, dtype, off, n = self.shards[np.random.choice(len(self.shards), p=self.p)]
        # nanoGPT: "recreate np.memmap every batch to avoid a memory leak"
        data = np.memmap(path, dtype=dtype, mode="r", offset=off, shape=(n,))
        ix = torch.randint(len(data) - self.T - 1, (self.B,))
        x = torch.stack([torch.from_numpy((data[i:i + self.T]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + self.T]).astype(np.int64)) for i in ix])
        return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--style", choices=["dataloader", "getbatch"], default="dataloader")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()
    torch.manual_seed(1)
    np.random.seed(1)
    if a.style == "getbatch":
        it, a.workers, name = GetBatch(a.data, "train", a.seq, a.batch), 0, "nanoGPT get_batch (np.memmap, in process)"
    else:
        it = iter(DataLoader(PackedWindows(a.data, "train", a.seq), batch_size=a.batch, shuffle=True,
                             num_workers=a.workers, drop_last=True, persistent_workers=True))
        name = "numpy memmap + torch DataLoader"
    for _ in range(a.warmup):
        next(it)
    t0, tokens = time.perf_counter(), 0
    for _ in range(a.batches):
        x, y = next(it)
        tokens += x.numel()
    s = time.perf_counter() - t0
    print(json.dumps({"peer": name, "style": a.style, "workers": a.workers, "seq": a.seq,
                      "batch": a.batch, "batches": a.batches, "seconds": round(s, 3),
                      "tokens_per_s": round(tokens / s), "bytes_per_s": round(16 * tokens / s)}))


if __name__ == "__main__":
    main()
