"""Copy a study folder's records into the repository: what a study needs to be read back with
--resume and what a reader needs to check its numbers, without what is large or machine-bound.

    python experiments/cifar10/keep_records.py STUDY_FOLDER DESTINATION

Kept: every file of the study and of its finished runs (a run folder with summary.json):
settings, tables, verdicts, plots, printed text, each run's config, summary and metrics. Left
out: checkpoints/ and last_batch.pt (megabytes each; a finished run is never resumed from
them), and runs that did not finish. Absolute paths under the checkout's parent folder are
written relative to the checkout (the data as ../data/cifar10, run folders as runs/...), and
each rewritten file's entry in its folder's contrastkit-manifest.json is brought up to date,
so that the copy reads back as contrastkit wrote it.
"""
import hashlib
import json
import os
import shutil
import sys

LEFT_OUT = ("checkpoints", "last_batch.pt")
TEXT = (".json", ".jsonl", ".yaml", ".csv", ".txt", ".md", ".html")
MANIFEST = "contrastkit-manifest.json"


def finished(folder):
    parent = os.path.basename(os.path.dirname(folder))
    return parent != "runs" or os.path.isfile(os.path.join(folder, "summary.json"))


def relative(text, checkout):
    parent = os.path.dirname(checkout)
    return text.replace(checkout + "/", "").replace(parent + "/", "../")


def keep(source, destination, checkout):
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in LEFT_OUT and finished(os.path.join(root, d)))
        target = os.path.join(destination, os.path.relpath(root, source))
        os.makedirs(target, exist_ok=True)
        rewritten = {}
        for name in sorted(files):
            if name in LEFT_OUT:
                continue
            path = os.path.join(root, name)
            if name.endswith(TEXT) and name != MANIFEST:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
                data = relative(text, checkout).encode("utf-8")
                with open(os.path.join(target, name), "wb") as handle:
                    handle.write(data)
                if data != text.encode("utf-8"):
                    rewritten[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            elif name != MANIFEST:
                shutil.copy2(path, os.path.join(target, name))
        if MANIFEST in files:
            with open(os.path.join(root, MANIFEST), encoding="utf-8") as handle:
                manifest = json.load(handle)
            entries = manifest.get("files", {})
            for name in list(entries):
                if name.split("/")[0] in LEFT_OUT or (name in dirs_left_out(root, name)):
                    del entries[name]
            for name, entry in rewritten.items():
                if name in entries:
                    entries[name] = entry
            with open(os.path.join(target, MANIFEST), "w", encoding="utf-8") as handle:
                handle.write(relative(json.dumps(manifest, indent=1, sort_keys=True), checkout) + "\n")


def dirs_left_out(root, name):
    """The manifest entry ``name`` of ``root`` when it lies in a run folder that did not finish."""
    first = name.split("/")[0]
    folder = os.path.join(root, first)
    return {name} if os.path.isdir(folder) and not finished(folder) else set()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    keep(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]),
         os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
