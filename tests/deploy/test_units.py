"""`trimtab install-systemd` renders units that `systemd-analyze verify` accepts, prints them with --dry-run, writes
them where asked and says what to run next, and fails with a message (exit 1) where it cannot write."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from trimtab.cli.main import cli
from trimtab.cli.systemd_cmd import ROLES, install_systemd

TRIMTAB = shutil.which("trimtab")


def run(*args: str):
    return CliRunner().invoke(install_systemd, list(args), catch_exceptions=False)


def directives(unit_text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit_text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return path


@pytest.mark.parametrize("role", ROLES)
def test_systemd_analyze_verify_accepts_each_generated_unit(role, tmp_path):
    analyze = systemd_analyze()
    # verify checks only that ExecStart's binary exists and is executable. Not this venv's trimtab: install-systemd
    # rightly refuses one under /tmp (PrivateTmp), and where the checkout's venv lives is no business of this test.
    exe = "/bin/true"
    res = run("--role", role, "--unit-dir", str(tmp_path), "--exec", exe)
    assert res.exit_code == 0, res.output
    unit = tmp_path / f"trimtab-{role}.service"
    # verify works without a running systemd (no PID 1 needed): it loads the file and its dependencies offline.
    # It exits 0 on unknown keys and unparsable values, only warning: so no line may mention our unit at all.
    proc = subprocess.run([analyze, "verify", "--man=no", "--recursive-errors=no", str(unit)],
                          capture_output=True, text=True, timeout=60, env={"SYSTEMD_LOG_LEVEL": "notice",
                                                                           "PATH": "/usr/bin:/bin"})
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if unit.name in line]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr


def test_verify_would_catch_a_broken_unit(tmp_path):
    """The check above has teeth: a typo'd key and a missing binary are reported against the unit's name."""
    analyze = systemd_analyze()
    unit = tmp_path / "trimtab-broken.service"
    unit.write_text("[Service]\nType=notify\nWatchdogSecs=30\nExecStart=/nonexistent/trimtab agent\n")
    proc = subprocess.run([analyze, "verify", "--man=no", "--recursive-errors=no", str(unit)],
                          capture_output=True, text=True, timeout=60)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "WatchdogSecs" in output and "/nonexistent/trimtab" in output, output


@pytest.mark.parametrize("role", ROLES)
def test_dry_run_prints_a_notify_unit_with_watchdog_restart_and_state_dir(role, tmp_path):
    res = run("--role", role, "--dry-run", "--unit-dir", str(tmp_path / "never"), "--exec", "/bin/true")
    assert res.exit_code == 0, res.output
    d = directives(res.stdout)
    assert d["Type"] == ["notify"] and d["NotifyAccess"] == ["main"]
    assert d["WatchdogSec"] == ["30"] and d["Restart"] == ["on-failure"] and d["RestartSec"] == ["5"]
    assert d["StateDirectory"] == ["trimtab"] and d["KillSignal"] == ["SIGTERM"] and d["TimeoutStopSec"] == ["30"]
    assert d["ExecStart"] == [f"/bin/true {role}"]
    assert d["EnvironmentFile"] == ["-/etc/trimtab/trimtab.env"]
    assert d["CapabilityBoundingSet"] == [""] and d["NoNewPrivileges"] == ["true"]
    assert d["WantedBy"] == ["multi-user.target"]
    assert not (tmp_path / "never").exists()  # a dry run writes nothing


def test_gpu_roles_reach_the_nvidia_devices_and_the_server_sees_none():
    for role in ("agent", "up"):
        d = directives(run("--role", role, "--dry-run", "--exec", "/bin/true").stdout)
        assert d["DevicePolicy"] == ["closed"] and d["DeviceAllow"] == ["char-nvidia* rw"]
        assert "PrivateDevices" not in d  # it would hide /dev/nvidia*
    d = directives(run("--role", "server", "--dry-run", "--exec", "/bin/true").stdout)
    assert d["PrivateDevices"] == ["true"] and "DeviceAllow" not in d


def test_install_writes_the_unit_and_says_what_to_run_next(tmp_path):
    res = CliRunner().invoke(cli, ["install-systemd", "--role", "agent", "--unit-dir", str(tmp_path),
                                   "--exec", "/bin/true"])
    assert res.exit_code == 0, res.output
    unit = tmp_path / "trimtab-agent.service"
    assert unit.stat().st_mode & 0o777 == 0o644
    assert "ExecStart=/bin/true agent" in unit.read_text()
    assert res.stdout.splitlines()[-1] == "next: systemctl daemon-reload && systemctl enable --now trimtab-agent"
    assert [p.name for p in tmp_path.iterdir()] == ["trimtab-agent.service"]  # no temporary file left


def test_the_default_executable_is_this_trimtab():
    res = run("--role", "up", "--dry-run")
    exec_start = directives(res.stdout)["ExecStart"][0]
    assert exec_start.endswith(" up")
    command = exec_start[: -len(" up")]
    assert Path(command.split(" ")[0]).is_absolute()
    if TRIMTAB is not None:
        assert Path(command).name == "trimtab"


def venv_trimtab_in(directory, kind: str, monkeypatch):
    """A trimtab script of a venv in ``directory``, which the renderer is told is one of its ``kind`` (HOME_DIRS,
    TMP_DIRS) directories."""
    import trimtab.cli.systemd_cmd as systemd_cmd

    monkeypatch.setattr(systemd_cmd, kind, (directory,))
    exe = directory / "venv" / "bin" / "trimtab"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/usr/bin/python3\n")
    exe.chmod(0o755)
    return exe


def test_an_executable_under_a_home_directory_keeps_homes_readable(tmp_path, monkeypatch):
    """ProtectHome=true would hide /root or /home from the service, and with it a trimtab installed there."""
    exe = venv_trimtab_in(tmp_path, "HOME_DIRS", monkeypatch)
    res = run("--role", "agent", "--dry-run", "--exec", str(exe))
    assert directives(res.stdout)["ProtectHome"] == ["read-only"]
    assert "under a home directory" in res.stderr
    assert directives(run("--role", "agent", "--dry-run", "--exec", "/bin/true").stdout)["ProtectHome"] == ["true"]


def test_paths_systemd_would_expand_are_escaped(tmp_path):
    exe = tmp_path / "my tools" / "trim%tab$1"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    exec_start = directives(run("--role", "server", "--dry-run", "--exec", str(exe)).stdout)["ExecStart"][0]
    assert exec_start == f'"{tmp_path}/my tools/trim%%tab$$1" server'


@pytest.mark.parametrize("bad, message", [
    ("relative/trimtab", "not an absolute path"),
    ("/nonexistent/trimtab", "not an executable file"),
])
def test_a_bad_executable_is_refused(bad, message):
    res = CliRunner().invoke(install_systemd, ["--role", "agent", "--dry-run", "--exec", bad])
    assert res.exit_code == 2 and message in res.stderr


def test_an_unwritable_unit_dir_is_a_clear_error(tmp_path):
    res = CliRunner().invoke(install_systemd, ["--role", "agent", "--unit-dir", str(tmp_path / "missing"),
                                               "--exec", "/bin/true"])
    assert res.exit_code == 1 and "is not a directory" in res.stderr and "--unit-dir" in res.stderr
    read_only = Path("/proc/self")  # refuses new files even to root
    res = CliRunner().invoke(install_systemd, ["--role", "agent", "--unit-dir", str(read_only), "--exec", "/bin/true"])
    assert res.exit_code == 1, res.output
    assert f"cannot write {read_only}/trimtab-agent.service" in res.stderr and "sudo" in res.stderr


def test_an_executable_under_tmp_is_refused_because_private_tmp_hides_it(tmp_path, monkeypatch):
    exe = venv_trimtab_in(tmp_path, "TMP_DIRS", monkeypatch)
    units = tmp_path / "units"
    units.mkdir()
    res = CliRunner().invoke(install_systemd, ["--role", "agent", "--unit-dir", str(units), "--exec", str(exe)])
    assert res.exit_code == 1
    assert f"it would run {exe}, which the service cannot see (PrivateTmp=true)" in res.stderr
    assert not list(units.iterdir()), "no unit that cannot start is written"
    dry = CliRunner().invoke(install_systemd, ["--role", "agent", "--dry-run", "--exec", str(exe)])
    assert dry.exit_code == 0 and f"WARNING: {exe} is under {tmp_path}" in dry.stderr and "PrivateTmp" in dry.stderr
    clean = CliRunner().invoke(install_systemd, ["--role", "agent", "--dry-run", "--exec", "/bin/true"])
    assert "WARNING" not in clean.stderr
