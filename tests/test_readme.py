"""What the README and docs/*.md promise a reader is checked here. The README opens with the two commands (the
second is the one CI runs, verbatim; the CPU torch advice reads before it), then what trimtab is, then the demo.
Every command in a shell block of the README or of docs/*.md, and every `trimtab …` in their prose, is one trimtab
accepts (tests/support/doc_commands.py); every Python block compiles, and the scripts they define run as written
against a real `trimtab up`, started the way the README says, in a fresh home directory — the tour's commands
verbatim but for the port (a free one, not 9460: other runs may hold it). Links between the pages resolve, every
page is linked from the README, and the count of Prometheus tests the README says skip without Debian's
`prometheus` is the suite's."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doc_commands import (DOC_FILES, EXTERNAL, SHELL_INFO, all_blocks, check_command, code_blocks,
                                        commands_of, inline_trimtab_commands, script_name, shell_lines)
from tests.support.procs import free_port, stop, wait_http

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# Every test in these files runs a real Prometheus (they skip, saying why, without one).
PROMETHEUS_TEST_FILES = ("tests/grafana/test_promql_queries.py", "tests/api/metrics/test_prometheus_scrape.py",
                         "tests/grafana/test_promql_units.py")
TWO_COMMANDS = ["pip install . && trimtab up", "python3 -m pip install -e '.[dev]' && python3 -m pytest"]


def opening_block() -> list[str]:
    block = re.search(r"\A# trimtab\n\n```sh\n(.*?)```", README, re.S)
    assert block, "the README opens with a shell block right under its title"
    return block.group(1).splitlines()


def opening_commands() -> list[str]:
    return [line for line in opening_block() if not line.startswith("#")]


def test_the_readme_opens_with_two_commands_then_what_trimtab_is_then_the_demo():
    assert opening_commands() == TWO_COMMANDS  # anything more is advice (a comment), never a third command
    lines = opening_block()
    advice = "\n".join(lines[:lines.index(TWO_COMMANDS[1])])
    # The CPU torch reads before the command that would pull the CUDA build, and so does what to do with PyPI alone.
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in advice
    assert "With PyPI alone" in advice and "CUDA build" in advice
    after = README.split("```", 2)[2].lstrip("\n")
    first_paragraph, rest = after.split("\n\n", 1)
    assert first_paragraph.startswith("trimtab keeps multi-GPU RL post-training jobs")
    assert rest.startswith("## The demo\n")


def test_ci_runs_the_readmes_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert opening_commands()[1] in ci.splitlines()


def test_the_readme_counts_the_prometheus_tests_right():
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                *PROMETHEUS_TEST_FILES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    n = sum("::" in line for line in collected.stdout.splitlines())
    assert n > 0, collected.stdout + collected.stderr
    said = re.search(r"the (\d+) Prometheus tests", " ".join(README.split()))
    assert said and int(said.group(1)) == n, f"the README says {said and said.group(1)}; the suite has {n}"


# -- every command of the pages ------------------------------------------------------------------------------------

def shell_commands() -> list[tuple[str, str, list[str]]]:
    out = [(b.where, line, words) for b in all_blocks() if b.info in SHELL_INFO
           for line in shell_lines(b) for words in commands_of(line)]
    out += [(where, line, shlex.split(line)) for path in DOC_FILES for where, line in inline_trimtab_commands(path)]
    return out


def test_the_pages_hold_commands_of_every_kind_the_check_knows():
    programs = {words[0] for _, _, words in shell_commands()}
    assert {"trimtab", "python", "python3", "pip"} <= programs, programs
    assert len(shell_commands()) > 60 and len(DOC_FILES) >= 10  # it reads the pages, not nothing


def test_every_command_in_the_readme_and_docs_is_one_trimtab_accepts():
    wrong = []
    for where, line, words in shell_commands():
        try:
            check_command(words)
        except AssertionError as exc:
            wrong.append(f"{where}: {line}\n    {exc}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("words, says", [
    (["trimtab", "check", "--windw", "30"], "No such option '--windw'"),
    (["trimtab", "tokens", "create"], "no such command"),
    (["trimtab", "token", "create", "--scope", "jobs"], "'jobs' is not one of"),
    (["trimtab", "check", "--window"], "requires an argument"),
    (["trimtab", "verl-tail", "x.jsonl", "--jobs", "j"], "names no --jobs"),
    (["python", "-m", "trimtab.workload", "--config", "huge"], "invalid choice"),
    (["pip", "install", ".[trainr]"], "no extra trainr"),
    (["python3", "bench/no_such_bench.py"], "no such file"),
    (["nvidia-smi"], "no check knows this program"),
])
def test_the_command_check_catches_what_it_is_for(words, says):
    with pytest.raises(AssertionError, match=re.escape(says)):
        check_command(words)


def test_every_python_block_compiles_and_every_config_block_parses():
    import yaml

    from tests.support.doc_commands import tomllib

    for b in all_blocks():
        if b.info == "python":
            compile(b.text, b.where, "exec")
        elif b.info == "toml":
            tomllib.loads(b.text)
        elif b.info == "yaml":
            yaml.safe_load(b.text)


def test_a_token_made_as_the_pages_say_lands_outside_the_checkout_and_job_token_is_ignored():
    outs = [words[words.index("--out") + 1] for _, _, words in shell_commands()
            if words[:3] == ["trimtab", "token", "create"] and "--out" in words]
    assert outs and all(out.startswith(("~/", "/")) for out in outs), outs  # never a file in the checkout
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: .gitignore is not read")
    for name in ("job.token", "my-job.token", "deploy/agents.token"):  # one made in the checkout all the same
        done = subprocess.run(["git", "check-ignore", "-q", "--no-index", name], cwd=ROOT)
        assert done.returncode == 0, f"git status would show {name}"


# -- the links -------------------------------------------------------------------------------------------------------

def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of ``path``."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_every_link_between_the_pages_resolves_and_every_page_is_linked_from_the_readme():
    broken = []
    for path in DOC_FILES:
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", README))
    assert linked == {f"docs/{p.name}" for p in DOC_FILES[1:]}, linked


# -- the tour, run as written ------------------------------------------------------------------------------------------

def tour_lines() -> list[str]:
    tour = README.split("## A short tour\n", 1)[1].split("\n## ", 1)[0]
    return [line for b in code_blocks_of(tour) for line in b]


def code_blocks_of(markdown: str) -> list[list[str]]:
    return [[line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
            for block in re.findall(r"^```sh\n(.*?)^```", markdown, re.S | re.M)]


def scripts() -> dict[str, str]:
    return {name: b.text + "\n" for path in DOC_FILES for b in code_blocks(path) if (name := script_name(b))}


@pytest.fixture(scope="module")
def fresh_home(tmp_path_factory):
    """A new user's machine: an empty home, `trimtab` and `python3` on PATH being this tree's (PYTHONPATH is kept),
    no TRIMTAB_* settings but the port `trimtab up` takes (a free one) and TRIMTAB_SERVER naming it, which the
    scripts read as the README says; `trimtab up` started as the README's first command starts it."""
    home = tmp_path_factory.mktemp("home")
    work = tmp_path_factory.mktemp("work")  # where the reader saves the scripts and runs the commands
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "trimtab").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m trimtab.cli.main "$@"\n')
    (bin_dir / "trimtab").chmod(0o755)
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(sys.executable)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMTAB_")}
    env.update(HOME=str(home), PATH=f"{bin_dir}:{env.get('PATH', '')}", TRIMTAB_PORT=str(port),
               TRIMTAB_SERVER=f"http://127.0.0.1:{port}",  # where the scripts report (they say so)
               PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]))
    up = opening_commands()[0].split("&&")[1].strip()
    assert up == "trimtab up"
    proc = subprocess.Popen(["bash", "-c", f"exec {up}"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout_s=60, proc=proc)
        yield home, work, env, port
    finally:
        stop(proc)


def run_line(line: str, fresh_home) -> subprocess.CompletedProcess:
    _, work, env, port = fresh_home
    return subprocess.run(["bash", "-c", line.replace(":9460", f":{port}")], cwd=work, env=env, capture_output=True,
                          text=True, timeout=180)


def test_the_tour_runs_as_written_and_check_shows_the_loops_update_phase(fresh_home):
    home, work, _, _ = fresh_home
    for name, text in scripts().items():
        (work / name).write_text(text)
    lines = tour_lines()
    assert any(line.startswith("trimtab token create") for line in lines) and "python3 my_loop.py" in lines
    for line in lines:
        absent = [w[0] for w in commands_of(line) if w[0] in EXTERNAL and shutil.which(w[0]) is None]
        if absent:  # a program of the reader's machine this one lacks (jq): nothing of trimtab's to run there
            print(f"not run, {', '.join(absent)} not installed: {line}")
            continue
        done = run_line(line, fresh_home)
        assert done.returncode in ((0, 1) if line.startswith("trimtab check") else (0,)), \
            f"{line}\n{done.stdout}\n{done.stderr}"
    token = home / ".config" / "trimtab" / "my-job.token"
    assert token.stat().st_mode & 0o777 == 0o600
    out = done.stdout  # the last line of the tour: trimtab check, after the loop ran
    assert lines[-1].startswith("trimtab check") and "\njob my-job " in out, out
    composition = next(line for line in out.splitlines() if "step_composition" in line)
    assert re.search(r"update \d+\.\d %", composition) and "update n/a" not in composition, composition
    last = out.rstrip().splitlines()[-1]  # the overall verdict, the one the exit code gives
    assert last.startswith("overall: ") and last.endswith(f"; exit {done.returncode}"), out
    assert ("OUT OF BALANCE" in last) == (done.returncode == 1), out


def test_the_hook_pages_fuller_loop_runs_as_written(fresh_home):
    import httpx

    _, work, _, port = fresh_home
    for name, text in scripts().items():
        (work / name).write_text(text)
    made = run_line("trimtab token create --name my-job --scope job --out ~/.config/trimtab/my-job.token", fresh_home)
    assert made.returncode == 0, made.stderr
    done = run_line("python3 my_ppo_loop.py", fresh_home)
    assert done.returncode == 0, done.stdout + done.stderr
    reports = httpx.get(f"http://127.0.0.1:{port}/v1/jobs/my-ppo-job/reports", params={"limit": 100}).json()["reports"]
    assert sorted(r["step"] for r in reports) == list(range(30))
    for phase in ("generation", "evaluation", "update", "communication"):  # each timed, as the loop says
        assert any(r[f"{phase}_s"] for r in reports), (phase, reports[0])
