"""A training-like process for the "No space left on device" scenario (plain Python, no ML libraries).

It behaves like the field report's PyTorch job, scaled down: every epoch it
"computes" for a moment, saves ``ckpt_epoch_N.pth`` the way ``torch.save`` does
(one file written in place, fsynced), appends to a rotating training log and
leaves a scratch file in its tmp directory.  It never deletes anything itself:
without outside help the disk fills and the run dies on the next write with
``OSError: [Errno 28] No space left on device``, traceback and all.

After each checkpoint it appends ``{"epoch", "path", "size", "sha256"}`` to a
manifest (JSON lines) that lives *off* the filesystem under test, so a test can
check that the newest checkpoints survived intact.  Exit status: 0 after the
last epoch, 1 with the traceback on stderr when a write failed.

    python trainer.py --ckpt-dir /data/run/ckpt --log-dir /data/run/logs --tmp-dir /data/tmp \\
        --epochs 20 --ckpt-size 3MiB --epoch-seconds 1 --manifest /elsewhere/manifest.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path

_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}


def parse_size(text: str) -> int:
    """'3MiB' -> 3145728; plain integers are bytes."""
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = text[len(number):].lower()
    if unit not in _UNITS or not number:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 512KiB, 3MiB)")
    return int(float(number) * _UNITS[unit])


def save_checkpoint(path: Path, size: int, epoch: int) -> str:
    """Write ``size`` bytes in place like torch.save (no temp file, no rename); return the sha256.

    The payload is different every epoch (weights change), so a checkpoint that got
    truncated or mixed up with another one fails its checksum.
    """
    digest = hashlib.sha256()
    block = hashlib.sha256(f"epoch {epoch}".encode()).digest() * 2048  # 64 KiB, epoch-specific
    with open(path, "wb") as fh:
        written = 0
        while written < size:
            chunk = block[:min(len(block), size - written)]
            fh.write(chunk)
            digest.update(chunk)
            written += len(chunk)
        fh.flush()
        os.fsync(fh.fileno())  # the allocation (and ENOSPC) happens now, not at some later writeback
    return digest.hexdigest()


def build_logger(log_dir: Path, max_bytes: int) -> logging.Logger:
    log_dir.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("trainer")
    logger.setLevel(logging.INFO)
    handler = RotatingFileHandler(log_dir / "train.log", maxBytes=max_bytes, backupCount=3)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    return logger


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--tmp-dir", type=Path, required=True)
    parser.add_argument("--manifest", type=Path, required=True, help="JSON lines, one per saved checkpoint")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--ckpt-size", type=parse_size, default=parse_size("3MiB"))
    parser.add_argument("--tmp-size", type=parse_size, default=parse_size("256KiB"),
                        help="scratch file left in --tmp-dir every epoch")
    parser.add_argument("--epoch-seconds", type=float, default=1.0, help="simulated compute time per epoch")
    parser.add_argument("--log-max-bytes", type=parse_size, default=parse_size("64KiB"))
    args = parser.parse_args(argv)

    for directory in (args.ckpt_dir, args.tmp_dir):
        directory.mkdir(parents=True, exist_ok=True)
    logger = build_logger(args.log_dir, args.log_max_bytes)
    logger.info("training started: %d epochs, checkpoint %d bytes, pid %d", args.epochs, args.ckpt_size, os.getpid())
    next_epoch_at = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        next_epoch_at += args.epoch_seconds
        while (left := next_epoch_at - time.monotonic()) > 0:  # "compute"
            time.sleep(min(left, 0.1))
            logger.info("epoch %d step loss=%.4f", epoch, 1.0 / (epoch + 1))
        (args.tmp_dir / f"dataloader_cache_{epoch}.tmp").write_bytes(b"\0" * args.tmp_size)
        path = args.ckpt_dir / f"ckpt_epoch_{epoch}.pth"
        sha256 = save_checkpoint(path, args.ckpt_size, epoch)
        with open(args.manifest, "a", encoding="utf-8") as manifest:
            manifest.write(json.dumps({"epoch": epoch, "path": str(path), "size": args.ckpt_size,
                                       "sha256": sha256, "saved_at": time.time()}) + "\n")
        logger.info("epoch %d done, saved %s", epoch, path.name)
    logger.info("training finished")
    print(f"finished {args.epochs} epochs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
