"""A tiny character-level language model, trained on the CPU, streaming to Runwatch.

Single process:   python examples/train_tiny.py --steps 300
Two ranks (DDP):  torchrun --standalone --nproc_per_node=2 examples/train_tiny.py --run-name r1

Set RUNWATCH_URL and RUNWATCH_TOKEN to stream to a dashboard (`make demo` does); without them
the Monitor is a no-op and the script just trains. The three Runwatch lines are marked below.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
import warnings
from pathlib import Path

# This CPU example needs no NumPy; don't let torch warn about its absence on every rank.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from trainer_plugin import Monitor  # noqa: E402  (Runwatch 1/3)

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_TEXT = DATA_DIR / "sonnets.txt"


class CharGRU(nn.Module):
    """Embedding → 2-layer GRU → linear head: about 110k parameters for a ~60-symbol alphabet."""

    def __init__(self, vocab_size: int, embed_dim: int = 64, hidden: int = 96, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.gru = nn.GRU(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden_states, _ = self.gru(self.embed(tokens))
        return self.head(hidden_states)


def load_corpus(path: Path) -> tuple[torch.Tensor, list[str]]:
    """The text as one long tensor of symbol ids; header lines starting with '#' are skipped."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    text = "".join(line for line in lines if not line.startswith("#"))
    alphabet = sorted(set(text))
    index = {char: i for i, char in enumerate(alphabet)}
    return torch.tensor([index[char] for char in text], dtype=torch.long), alphabet


def shard_for_rank(corpus: torch.Tensor, rank: int, world_size: int, seq_len: int) -> torch.Tensor:
    """Each rank trains on its own contiguous slice of the text, as a real data-parallel job would."""
    size = len(corpus) // world_size
    shard = corpus[rank * size : (rank + 1) * size]
    if len(shard) <= seq_len + 1:
        raise SystemExit(f"the text is too short for {world_size} ranks at --seq-len {seq_len}")
    return shard


def sample_batch(
    shard: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, len(shard) - seq_len - 1, (batch_size,), generator=generator)
    windows = torch.stack([shard[start : start + seq_len + 1] for start in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def learning_rate(step: int, total_steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class StopRequest:
    """Ctrl-C (or the launcher passing on SIGINT/SIGTERM) asks to stop; the ranks agree on the step.

    A rank that simply died on the signal would leave the others blocked in the next gradient
    all-reduce until the collective times out, so the signal only raises a flag and every step the
    ranks all-reduce it: they leave the loop together, each through its Monitor's `with` block.
    """

    def __init__(self, distributed: bool):
        self.distributed = distributed
        self.requested = False
        self._previous = {sig: signal.signal(sig, self._request) for sig in (signal.SIGINT, signal.SIGTERM)}

    def release(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True

    def agreed(self) -> bool:
        if not self.distributed:
            return self.requested
        flag = torch.tensor([1 if self.requested else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per rank and step")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--project", default=None, help="Runwatch project (else RUNWATCH_PROJECT)")
    # --run-name for torchrun: its own parser reads a bare `--run` as an ambiguous abbreviation of
    # --run-path and stops, even after the script's name.
    parser.add_argument("--run-name", "--run", dest="run", help="run name (else RUNWATCH_RUN, tiny-char-lm)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--data", type=Path, default=DEFAULT_TEXT, help="a UTF-8 text file")
    parser.add_argument("--log-every", type=int, default=100, help="print the loss every N steps")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="save a checkpoint every N steps (0: never)"
    )
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("var/checkpoints"))
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> list[float]:
    """Train and return rank 0's loss at every step (other ranks return theirs)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    distributed = world_size > 1
    # Several ranks share a couple of cores: one thread each keeps them from fighting over them.
    torch.set_num_threads(1)
    if distributed:
        dist.init_process_group(backend="gloo")
    stop = StopRequest(distributed)

    try:
        corpus, alphabet = load_corpus(args.data)
        shard = shard_for_rank(corpus, rank, world_size, args.seq_len)
        # Same initial weights on every rank (DDP also broadcasts them), a different data stream.
        torch.manual_seed(args.seed)
        model: nn.Module = CharGRU(len(alphabet))
        if distributed:
            model = DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        batches = torch.Generator().manual_seed(args.seed * 1000 + rank)
        batch_tokens = args.batch_size * args.seq_len
        run_name = args.run or os.environ.get("RUNWATCH_RUN") or "tiny-char-lm"
        if rank == 0:
            params = sum(p.numel() for p in model.parameters())
            print(
                f"tiny-char-lm: {params:,} parameters, {len(alphabet)} symbols, "
                f"{len(corpus):,} characters, {world_size} rank(s), {args.steps} steps",
                flush=True,
            )

        losses: list[float] = []
        # Runwatch 2/3: url, token and project fall back to RUNWATCH_* variables; no URL, no-op.
        with Monitor(
            project=args.project, run=run_name, config=vars(args) | {"world_size": world_size}
        ) as mon:
            started = time.perf_counter()
            for step in range(args.steps):
                if stop.agreed():
                    raise KeyboardInterrupt
                lr = learning_rate(step, args.steps, args.lr, args.warmup_steps)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                inputs, targets = sample_batch(shard, args.batch_size, args.seq_len, batches)
                logits = model(inputs)
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()

                mon.step(loss=loss.detach(), lr=lr, tokens=batch_tokens)  # Runwatch 3/3
                losses.append(loss.item())

                if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
                    elapsed = time.perf_counter() - started
                    print(
                        f"step {step:5d}  loss {losses[-1]:.3f}  lr {lr:.2e}  "
                        f"{(step + 1) / elapsed:.1f} steps/s",
                        flush=True,
                    )
                if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and rank == 0:
                    save_checkpoint(args.checkpoint_dir / f"{run_name}.pt", model, optimizer, step)
        return losses
    finally:
        stop.release()
        if distributed and dist.is_initialized():
            dist.destroy_process_group()


def save_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = model.module.state_dict() if isinstance(model, DistributedDataParallel) else model.state_dict()
    partial = path.with_suffix(".tmp")
    torch.save({"step": step, "model": weights, "optimizer": optimizer.state_dict()}, partial)
    partial.replace(path)  # never leave a half-written checkpoint under the real name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        train(args)
    except KeyboardInterrupt:
        # Ctrl-C (or the launcher stopping us): the Monitor has recorded the interruption on its
        # way out of the `with` block; leave quietly instead of printing a traceback.
        if int(os.environ.get("RANK", "0")) == 0:
            print("tiny-char-lm: interrupted", file=sys.stderr, flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
