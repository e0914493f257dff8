"""GulpIO's reference implementation (gulpio2) driven for tests/gulp.rs and benches/gulp.py.

  gulp_ref.py write OUT VIDEOS_PER_CHUNK ID=PATH:LABEL ...   writes a dataset with gulpio2's GulpChunk;
      frames are the ffmpeg CLI's `-pix_fmt rgb24` decode of each video (as `ffmpeg -i F` picks them)
  gulp_ref.py ids DIR            prints {id: frame count} as gulpio2 reads the directory (no pixels kept)
  gulp_ref.py read DIR DUMP      reads every video with gulpio2's GulpDirectory and writes DUMP/<n>.npy
      (uint8 [T,H,W,3]) and DUMP/index.json ([{"id", "npy", "meta"}], ids sorted)
"""
import json
import os
import subprocess
import sys

import numpy as np
from gulpio2 import GulpDirectory
from gulpio2.fileio import GulpChunk


def rgb_frames(path):
    probe = subprocess.run(
        ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
         "stream=width,height:stream_side_data=rotation", "-of", "json", path],
        check=True, capture_output=True, text=True)
    s = json.loads(probe.stdout)["streams"][0]
    w, h = s["width"], s["height"]
    rot = 0
    for sd in s.get("side_data_list", []):
        rot = int(sd.get("rotation", 0))
    if rot % 180 != 0:
        w, h = h, w
    raw = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", path, "-map", "0:v:0", "-fps_mode", "passthrough",
         "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        check=True, capture_output=True).stdout
    return np.frombuffer(raw, np.uint8).reshape(-1, h, w, 3)


def write(out, per_chunk, specs):
    os.makedirs(out, exist_ok=True)
    labels = {}
    for i in range(0, len(specs), per_chunk):
        k = i // per_chunk
        chunk = GulpChunk(os.path.join(out, f"data_{k}.gulp"), os.path.join(out, f"meta_{k}.gmeta"))
        with chunk.open("wb"):
            for spec in specs[i:i + per_chunk]:
                vid, rest = spec.split("=", 1)
                path, label = rest.rsplit(":", 1)
                labels.setdefault(label, len(labels))
                frames = rgb_frames(path)
                chunk.append(vid, {"label": label, "source": os.path.basename(path)}, list(frames))
    with open(os.path.join(out, "label2idx.json"), "w") as f:
        json.dump(labels, f)


def read(d, dump):
    os.makedirs(dump, exist_ok=True)
    g = GulpDirectory(d)
    index = []
    for n, vid in enumerate(sorted(g.merged_meta_dict)):
        frames, meta = g[vid]
        arr = np.stack([np.asarray(f, np.uint8) for f in frames])
        name = f"{n}.npy"
        np.save(os.path.join(dump, name), arr)
        index.append({"id": vid, "npy": name, "meta": meta, "shape": list(arr.shape)})
    with open(os.path.join(dump, "index.json"), "w") as f:
        json.dump(index, f)


def ids(d):
    g = GulpDirectory(d)
    counts = {}
    for vid in sorted(g.merged_meta_dict):
        frames, _ = g[vid]
        counts[vid] = len(frames)
    print(json.dumps(counts))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif sys.argv[1] == "ids":
        ids(sys.argv[2])
    elif sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}")
