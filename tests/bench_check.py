"""Checks a benches/reference.py results.json from tests/bench_smoke.sh: same clips everywhere, same pixels."""

import json
import sys

report = json.load(open(sys.argv[1]))
failures = []
checked = 0
for variant, res in report["variants"].items():
    for workload in ("train", "full"):
        wl = res["workloads"].get(workload)
        if wl is None:
            failures.append(f"{variant}/{workload}: not run")
            continue
        systems = wl["systems"]
        want = systems["vserve"]["clips"]
        expected = res["videos"] if workload == "train" else min(res["videos"], 2)
        if want != expected:
            failures.append(f"{variant}/{workload}: vserve delivered {want} clips, expected {expected}")
        for peer in ("pyav", "decord"):
            if peer not in systems:
                failures.append(f"{variant}/{workload}: {peer} did not run")
                continue
            if systems[peer]["clips"] != want:
                failures.append(f"{variant}/{workload}: {peer} delivered {systems[peer]['clips']} clips, vserve {want}")
            cmp = wl.get("first_batch_vs_vserve", {}).get(peer)
            if not cmp or "identical_frames" not in cmp:
                failures.append(f"{variant}/{workload}: no pixel comparison for {peer}: {cmp}")
                continue
            checked += cmp["frames"]
            if cmp["identical_frames"] != cmp["frames"] or cmp["max_abs"] != 0:
                failures.append(
                    f"{variant}/{workload}: {peer} differs from vserve: {cmp['identical_frames']}/{cmp['frames']} "
                    f"frames identical, max |diff| {cmp['max_abs']}"
                )
    # The steady daemon (other epochs streamed first through a small cache, so its frame buffers and arenas
    # are recycled) must deliver every clip, its first batch identical to the cold daemon's.
    steady = res["workloads"].get("steady")
    if steady is None:
        failures.append(f"{variant}/steady: not run")
    else:
        if steady["systems"]["vserve"]["clips"] != res["videos"]:
            failures.append(f"{variant}/steady: delivered {steady['systems']['vserve']['clips']} clips, expected {res['videos']}")
        cmp = steady.get("first_batch_vs_vserve", {}).get("vserve (cold train)")
        if not cmp or "identical_frames" not in cmp:
            failures.append(f"{variant}/steady: no comparison with the cold daemon's first batch: {cmp}")
        else:
            checked += cmp["frames"]
            if cmp["identical_frames"] != cmp["frames"] or cmp["max_abs"] != 0:
                failures.append(
                    f"{variant}/steady: first batch differs from the cold daemon's: {cmp['identical_frames']}/"
                    f"{cmp['frames']} frames identical, max |diff| {cmp['max_abs']}"
                )
if failures:
    print("bench smoke FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"bench smoke: vserve, PyAV and decord agree bit for bit on {checked} frames (train stream, full videos, a steady daemon's recycled buffers)")
