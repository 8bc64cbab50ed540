#!/usr/bin/env python3
"""Lints Tandem's Dockerfiles (Debian has no hadolint, and these machines no Docker engine).

Checks what a reviewer of a production image would: pinned base images, a non-root final user,
exec-form ENTRYPOINT/CMD, apt-get hygiene, ADD only for URLs, COPY --from naming an earlier
stage, ARGs declared in the stage that uses them, no sudo or `curl | sh`, and, against the
repository: every file a RUN or COPY names exists, the build stage runs scripts/build.sh (the
script CI builds with), EXPOSE matches the ports of deploy/docker/tandem.yaml, and a
.dockerignore keeps build trees and .git out of the context.

Usage: deploy/docker/lint.py [DOCKERFILE ...]   (default: deploy/docker/Dockerfile.*)
       deploy/docker/lint.py --self-test        (each rule fires on a broken Dockerfile)
Exit status 0 when clean; 1 with one line per problem, `file:line: [rule] message`.
"""
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = "scripts/build.sh"
CI_SCRIPT = "scripts/test.sh"


def instructions(text):
    """(line number, INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out, pending, start = [], "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        pending += stripped
        word, _, args = pending.partition(" ")
        out.append((start, word.upper(), args.strip()))
        pending = ""
    if pending:
        word, _, args = pending.partition(" ")
        out.append((start, word.upper(), args.strip()))
    return out


def yaml_ports(path):
    """Ports of every `listen: host:port` line of the image's default config."""
    return {int(m.group(1)) for m in re.finditer(r"listen:\s*\S+:(\d+)", path.read_text())}


def lint(path, text, repo=REPO):
    problems = []

    def bad(line, rule, message):
        problems.append(f"{path}:{line}: [{rule}] {message}")

    known = {"FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "EXPOSE",
             "ENTRYPOINT", "CMD", "LABEL", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
             "ONBUILD"}
    stages = []  # [{"name", "line", "args": set, "user", "runs": [...], ...}]
    global_args = set()
    for line, word, args in instructions(text):
        if word not in known:
            bad(line, "syntax", f"unknown instruction {word}")
            continue
        if word == "FROM":
            parts = args.split()
            image = next((p for p in parts if not p.startswith("--")), "")
            name = parts[parts.index("AS") + 1] if "AS" in parts else (
                parts[parts.index("as") + 1] if "as" in parts else None)
            earlier = {s["name"] for s in stages}
            if image not in earlier and "$" not in image:
                base, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
                if not tag or tag == "latest":
                    bad(line, "pin", f"base image {image} needs an explicit tag other than latest")
            stages.append({"name": name, "line": line, "args": set(), "user": None,
                           "entrypoint": None, "cmd": None, "runs": [], "copies": [],
                           "expose": set()})
            continue
        if not stages:
            if word == "ARG":
                global_args.add(args.split("=")[0].strip())
            else:
                bad(line, "syntax", f"{word} before the first FROM")
            continue
        stage = stages[-1]
        for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", args if word != "RUN" else ""):
            if var not in stage["args"] and word not in ("ENV",) and var not in ("PATH",):
                bad(line, "arg", f"${var} is not declared by an ARG in this stage"
                    + (" (an ARG before FROM must be repeated after it)" if var in global_args else ""))
        if word == "ARG":
            stage["args"].add(args.split("=")[0].strip())
        elif word == "ENV":
            for key in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", args):
                stage["args"].add(key)
        elif word == "USER":
            stage["user"] = (line, args)
        elif word in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(args)
                ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            except json.JSONDecodeError:
                ok = False
            if not ok:
                bad(line, "exec-form", f"{word} must be a JSON array (exec form), so signals "
                    "reach tandem and it can drain")
            stage[word.lower()] = (line, value if ok else None)
        elif word == "ADD":
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            for s in sources:
                if not s.startswith("https://") and not re.match(r"\$\{?\w+\}?/", s):
                    bad(line, "add", f"ADD {s}: use COPY for local files (ADD only fetches URLs)")
                if s.startswith("http://"):
                    bad(line, "add", f"ADD {s}: fetch over https")
        elif word == "COPY":
            stage["copies"].append((line, args))
            m = re.search(r"--from=(\S+)", args)
            if m and m.group(1) not in {s["name"] for s in stages[:-1]}:
                bad(line, "copy-from", f"COPY --from={m.group(1)} names no earlier stage")
            if not m:
                for src in [a for a in args.split() if not a.startswith("--")][:-1]:
                    if src != "." and not (repo / src).exists():
                        bad(line, "missing", f"COPY {src}: no such path in the repository")
        elif word == "WORKDIR":
            if not args.startswith("/"):
                bad(line, "workdir", f"WORKDIR {args} must be absolute")
        elif word == "EXPOSE":
            stage["expose"] |= {int(p.split("/")[0]) for p in args.split()}
        elif word == "RUN":
            stage["runs"].append((line, args))
            if re.search(r"\bsudo\b", args):
                bad(line, "sudo", "no sudo in images: RUN already runs as the stage's user")
            if re.search(r"(curl|wget)[^|;&]*\|\s*(ba)?sh", args):
                bad(line, "pipe-sh", "do not pipe a download into a shell")
            if "apt-get install" in args:
                if "--no-install-recommends" not in args:
                    bad(line, "apt", "apt-get install needs --no-install-recommends")
                if not re.search(r"apt-get install[^&;]*\s-y\b|apt-get install -y", args) and \
                        " -y " not in args:
                    bad(line, "apt", "apt-get install needs -y")
                if "apt-get update" not in args:
                    bad(line, "apt", "apt-get install without apt-get update in the same RUN "
                        "uses stale (or no) package lists")
            if "apt-get update" in args and "rm -rf /var/lib/apt/lists/*" not in args:
                bad(line, "apt", "remove /var/lib/apt/lists/* in the RUN that fills it")
            for ref in re.findall(r"(?<![\w/])((?:scripts|deploy)/[\w./-]+)", args):
                target = repo / ref
                if not target.exists():
                    bad(line, "missing", f"RUN names {ref}, which is not in the repository")
                elif target.suffix in (".sh", ".py") and not target.stat().st_mode & 0o111:
                    bad(line, "missing", f"RUN runs {ref}, which is not executable")

    if not stages:
        bad(1, "syntax", "no FROM")
        return problems
    final = stages[-1]
    user = final["user"]
    if user is None:
        bad(final["line"], "user", "the final stage runs as root: add USER with a numeric uid")
    else:
        uid = user[1].split(":")[0]
        if not uid.isdigit() or int(uid) == 0:
            bad(user[0], "user", f"USER {user[1]}: use a numeric non-zero uid (Kubernetes "
                "runAsNonRoot can only verify numbers)")
    entry = final["entrypoint"]
    if entry is None or entry[1] != ["/usr/local/bin/tandem"]:
        bad(final["line"], "entrypoint", 'the final stage needs ENTRYPOINT ["/usr/local/bin/tandem"] '
            "(one image, the role chosen by arguments)")
    if not any(a.split()[-1] == "/usr/local/bin/tandem" for _, a in final["copies"]):
        bad(final["line"], "entrypoint", "the final stage does not copy tandem to /usr/local/bin")
    if len(stages) < 2:
        bad(final["line"], "multi-stage", "build in one stage and run in another (multi-stage)")
    builds = [line for s in stages[:-1] for line, a in s["runs"] if BUILD_SCRIPT in a]
    if not builds:
        bad(stages[0]["line"], "recipe", f"no build stage runs {BUILD_SCRIPT}, the script CI "
            "builds with")
    ci = repo / CI_SCRIPT
    if ci.exists() and BUILD_SCRIPT not in ci.read_text():
        bad(1, "recipe", f"{CI_SCRIPT} does not build with {BUILD_SCRIPT}: the image would not "
            "be built the way CI tests it")
    config = repo / "deploy/docker/tandem.yaml"
    if config.exists() and final["expose"] != yaml_ports(config):
        bad(final["line"], "expose", f"EXPOSE {sorted(final['expose'])} differs from the ports "
            f"of deploy/docker/tandem.yaml {sorted(yaml_ports(config))}")
    ignore = repo / ".dockerignore"
    if not ignore.exists():
        bad(1, "context", ".dockerignore is missing: build trees and .git would enter the context")
    else:
        entries = ignore.read_text().split()
        for needed in (".git", "build*/"):
            if needed not in entries:
                bad(1, "context", f".dockerignore does not exclude {needed}")
    return problems


GOOD = """
FROM debian:bookworm AS build
WORKDIR /src
COPY . .
RUN scripts/build.sh /src/b -- tandem
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends zlib1g \\
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/b/tools/tandem/tandem /usr/local/bin/tandem
USER 10001:10001
EXPOSE 8000 7100 7200 7000 9090
ENTRYPOINT ["/usr/local/bin/tandem"]
CMD ["serve"]
"""

# Each broken variant of GOOD and the rule it must trip.
BROKEN = {
    "pin": ("FROM debian:bookworm AS build", "FROM debian AS build"),
    "user": ("USER 10001:10001", "USER root"),
    "exec-form": ('CMD ["serve"]', "CMD tandem serve"),
    "apt": ("--no-install-recommends zlib1g", "zlib1g"),
    "add": ("COPY . .", "ADD . ."),
    "copy-from": ("--from=build", "--from=builder"),
    "recipe": ("RUN scripts/build.sh /src/b -- tandem", "RUN cmake -S . -B /src/b && ninja -C /src/b"),
    "missing": ("COPY . .", "COPY no-such-dir /x"),
    "entrypoint": ('ENTRYPOINT ["/usr/local/bin/tandem"]', 'ENTRYPOINT ["/bin/sh"]'),
    "expose": ("EXPOSE 8000 7100", "EXPOSE 8080 7100"),
    "sudo": ("RUN apt-get update", "RUN sudo apt-get update"),
    "workdir": ("WORKDIR /src", "WORKDIR src"),
    "arg": ("WORKDIR /src", "WORKDIR /src/${VERSION}"),
}


def self_test():
    failures = []
    clean = lint("good", GOOD)
    if clean:
        failures.append(f"the clean Dockerfile is flagged: {clean}")
    for rule, (old, new) in BROKEN.items():
        assert old in GOOD, rule
        found = lint(f"broken-{rule}", GOOD.replace(old, new, 1))
        if not any(f"[{rule}]" in p for p in found):
            failures.append(f"rule {rule} did not fire on: {new} (got {found})")
    for f in failures:
        print("FAIL:", f)
    print(f"lint self-test: {len(BROKEN)} broken Dockerfiles, {len(failures)} failure(s)")
    return 1 if failures else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    paths = [Path(p) for p in argv[1:]] or sorted((REPO / "deploy/docker").glob("Dockerfile.*"))
    if not paths:
        print("lint: no Dockerfiles found")
        return 1
    problems = []
    for p in paths:
        problems += lint(p.relative_to(REPO) if p.is_absolute() else p, p.read_text())
    for p in problems:
        print(p)
    print(f"lint: {len(paths)} Dockerfile(s), {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
