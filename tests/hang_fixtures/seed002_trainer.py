# The MiniGPT DDP trainer of field guide 002 (tests/lint_seeds/seed002_block08.py), with
# only its sizes made small for 2 CPU ranks (block 16, batch 4, vocab 64, 1 layer, a
# 600-token stream, 2 epochs, no loader workers), `torch.cuda.set_device` guarded (the
# guide calls it unconditionally, which fails without CUDA) and no file written.
# Its bug is untouched: `run_val()` all-reduces, and is called only under `if is_main():`.
# train_ddp_minigpt.py
import os, math, time, glob, torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, DataLoader, DistributedSampler
from torch.cuda.amp import GradScaler, autocast

USE_AMP = torch.cuda.is_available()
BLOCK_SIZE = 16
BATCH_SIZE = 4
GRAD_ACCUM_STEPS = 2
LR = 3e-4
EPOCHS = 2
CLIP_NORM = 1.0

def setup_dist():
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():  # CHANGED: the guide calls it unconditionally (fails on CPU)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))

def is_main():
    return int(os.environ.get("RANK", "0")) == 0

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embed, n_head, block_size, drop=0.1):
        super().__init__()
        assert n_embed % n_head == 0
        self.n_head = n_head
        self.qkv = nn.Linear(n_embed, 3*n_embed, bias=False)
        self.proj = nn.Linear(n_embed, n_embed, bias=False)
        self.attn_drop, self.resid_drop = nn.Dropout(drop), nn.Dropout(drop)
        mask = torch.tril(torch.ones(block_size, block_size))
        self.register_buffer("mask", mask.view(1,1,block_size,block_size))
    def forward(self, x):
        B,T,C = x.shape
        q,k,v = self.qkv(x).chunk(3, dim=-1)
        nh = self.n_head
        q = q.view(B,T,nh,-1).transpose(1,2)
        k = k.view(B,T,nh,-1).transpose(1,2)
        v = v.view(B,T,nh,-1).transpose(1,2)
        att = (q @ k.transpose(-2,-1)) / (k.size(-1) ** 0.5)
        att = att.masked_fill(self.mask[:,:,:T,:T]==0, float('-inf'))
        att = self.attn_drop(att.softmax(dim=-1))
        y = att @ v
        y = y.transpose(1,2).contiguous().view(B,T,-1)
        return self.resid_drop(self.proj(y))

class Block(nn.Module):
    def __init__(self, n_embed, n_head, block_size, drop=0.1):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(n_embed), CausalSelfAttention(n_embed, n_head, block_size, drop)
        self.ln2 = nn.LayerNorm(n_embed)
        self.mlp = nn.Sequential(nn.Linear(n_embed, 4*n_embed), nn.GELU(), nn.Linear(4*n_embed, n_embed), nn.Dropout(drop))
    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x

class MiniGPT(nn.Module):
    def __init__(self, vocab, n_embed=32, n_head=2, n_layer=1, block=256, drop=0.1):
        super().__init__()
        self.block_size = block
        self.tok_emb = nn.Embedding(vocab, n_embed)
        self.pos_emb = nn.Embedding(block, n_embed)
        self.drop = nn.Dropout(drop)
        self.blocks = nn.ModuleList([Block(n_embed, n_head, block, drop) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embed)
        self.head = nn.Linear(n_embed, vocab, bias=False)
    def forward(self, idx, targets=None):
        B,T = idx.shape
        pos = torch.arange(0, T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos)[None,:,:])
        for blk in self.blocks: x = blk(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(B*T, -1), targets.view(B*T))
        return logits, loss

class TokenStreamDataset(Dataset):
    def __init__(self, tensor, block):
        self.data, self.block = tensor, block
    def __len__(self): return len(self.data) - self.block - 1
    def __getitem__(self, i):
        x = self.data[i:i+self.block]
        y = self.data[i+1:i+1+self.block]
        return x, y

def main():
    setup_dist()
    device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True

    # Fake data stream (replace with your BPE tensor)
    VOCAB = 64
    train_stream = torch.randint(0, VOCAB, (600,), dtype=torch.long)
    val_stream   = torch.randint(0, VOCAB, (200,),  dtype=torch.long)

    train_ds = TokenStreamDataset(train_stream, BLOCK_SIZE)
    val_ds   = TokenStreamDataset(val_stream,   BLOCK_SIZE)

    train_samp = DistributedSampler(train_ds, shuffle=True, drop_last=True)
    val_samp   = DistributedSampler(val_ds,   shuffle=False, drop_last=False)

    # Micro-batch per step; use GRAD_ACCUM_STEPS to enlarge global batch
    train_dl = DataLoader(train_ds, batch_size=BATCH_SIZE, sampler=train_samp, num_workers=0, pin_memory=False)
    val_dl   = DataLoader(val_ds,   batch_size=BATCH_SIZE, sampler=val_samp,   num_workers=0, pin_memory=False)

    model = MiniGPT(VOCAB, n_embed=32, n_head=2, n_layer=1, block=BLOCK_SIZE, drop=0.1).to(device)
    model = DDP(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    scaler = GradScaler(enabled=USE_AMP)

    def run_val():
        model.eval()
        total, count = torch.tensor(0.0, device=device), torch.tensor(0, device=device)
        with torch.no_grad():
            for xb, yb in val_dl:
                xb, yb = xb.to(device), yb.to(device)
                _, loss = model(xb, yb)
                total += loss.detach()
                count += 1
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        dist.all_reduce(count, op=dist.ReduceOp.SUM)
        model.train()
        return (total / count).item()

    for epoch in range(EPOCHS):
        train_samp.set_epoch(epoch)
        opt.zero_grad(set_to_none=True)
        for step, (xb, yb) in enumerate(train_dl):
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            with autocast(enabled=USE_AMP, dtype=torch.bfloat16 if USE_AMP else None):
                _, loss = model(xb, yb)
                loss = loss / GRAD_ACCUM_STEPS
            scaler.scale(loss).backward()

            if (step + 1) % GRAD_ACCUM_STEPS == 0:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
                scaler.step(opt); scaler.update()
                opt.zero_grad(set_to_none=True)

        if is_main():
            vl = run_val()
            print(f"epoch {epoch+1}/{EPOCHS} | val_loss {vl:.4f}")

    if is_main():
        pass  # CHANGED: no file written

    dist.barrier(); dist.destroy_process_group()

if __name__ == "__main__":
    main()
