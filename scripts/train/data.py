"""Training data: the Python standard library sources every Debian machine has.

Files: every *.py under the root (default /usr/lib/python3.11), sorted by relative path, except
test code: any directory component named test, tests, idle_test, testing or testdata, and file
names test_*.py / *_test.py. Read as UTF-8; files that do not decode are skipped.

Held-out split: a file is held out (evaluation only, never trained on, not seen by the tokenizer
trainer) when int(sha256(relative path)[:8], 16) % 1000 < 30, i.e. ~3% of files, independent of
the seed.
"""

import hashlib
import os

EXCLUDED_DIRS = {"test", "tests", "idle_test", "testing", "testdata", "__pycache__"}


def is_test_file(rel):
    parts = rel.split(os.sep)
    if any(p in EXCLUDED_DIRS for p in parts[:-1]):
        return True
    name = parts[-1]
    return name.startswith("test_") or name.endswith("_test.py")


def is_held_out(rel):
    return int(hashlib.sha256(rel.encode("utf-8")).hexdigest()[:8], 16) % 1000 < 30


def list_files(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if not is_test_file(rel):
                    out.append(rel)
    return sorted(out)


def load_corpus(root):
    """Returns (train, held_out, skipped): lists of (relative path, text)."""
    train, held, skipped = [], [], []
    for rel in list_files(root):
        try:
            with open(os.path.join(root, rel), "rb") as f:
                text = f.read().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            skipped.append(rel)
            continue
        (held if is_held_out(rel) else train).append((rel, text))
    return train, held, skipped
