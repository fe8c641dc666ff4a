"""When the machine misbehaves during a scan (issue 26): a full disk at every write site, opscope
itself killed, two scans into one folder, a re-scan over an older one.

Write failures are injected at the one writer (``opscope.atomic``, ``OPSCOPE_FAIL_WRITE``), which
the scan's parent and child processes both go through; a real full disk is a small tmpfs,
used only where the test may mount one.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, run_opscope
from opscope.capture import run_folder
from opscope.errors import EXIT_USAGE, EXIT_WRITE_FAILED, UserError
from opscope.report.json_out import read_scan_json

SCRIPT = SCRIPTS / "mlp_paced.py"


def _scan_cmd(out: Path, steps: int, *extra: str, pause: float = 0.0) -> list[str]:
    return [sys.executable, "-m", "opscope", "scan", str(SCRIPT), "--steps", str(steps), "--out", str(out),
            "--quiet", *extra, "--", "--pause", str(pause)]


def _scan(out: Path, steps: int, *extra: str, env: dict | None = None, pause: float = 0.0):
    return subprocess.run(_scan_cmd(out, steps, *extra, pause=pause), cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, **(env or {})))


def _opscope_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("opscope:")]


def _no_half_files(out: Path) -> None:
    """No temp file left, and every JSON file opscope wrote parses."""
    assert not [p for p in out.rglob("*.tmp")], sorted(out.rglob("*"))
    for path in [*out.glob("*.json"), *(out / "traces").glob("*.json"), *(out / "capture").glob("*.json")]:
        json.loads(path.read_text(encoding="utf-8"))


def _complete_steps(out: Path) -> list[int]:
    return [s["index"] for s in json.loads((out / "scan.json").read_text())["steps"] if s["complete"]]


# -- a write failure at every write site of a scan -----------------------------------------------
SITES = {   # OPSCOPE_FAIL_WRITE -> (--format, complete steps that must survive)
    "traces/step_0003.json": ("html", 2),
    "capture/steps.jsonl@3": ("html", 2),
    "capture/runtime.json": ("html", 4),
    "capture/outcome.json": ("html", 4),
    "scan.json": ("html", 4),
    "operators.csv": ("html", 4),
    "report.html": ("html", 4),
    "report.xlsx": ("xlsx", 4),
    "report.md": ("md", 4),
    "findings.sarif": ("sarif", 4),
}


@pytest.mark.parametrize("site", sorted(SITES))
def test_a_failed_write_is_one_line_exit_7_and_keeps_the_complete_steps(tmp_path, site):
    fmt, kept = SITES[site]
    out = tmp_path / "run"
    proc = _scan(out, 4, "--format", fmt, env={"OPSCOPE_FAIL_WRITE": site})
    assert proc.returncode == EXIT_WRITE_FAILED, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "OSError" not in proc.stderr + proc.stdout
    lines = _opscope_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("opscope: error: no space left on device writing "), lines
    written = site.split("@")[0]
    assert f"writing {out / written} (" in lines[0], lines[0]
    assert f"{kept} complete steps kept in {out}" in lines[0] and "free ~" in lines[0], lines[0]
    _no_half_files(out)
    if site != "report.html":  # the failed report is not there, and nothing stands in for it
        assert not (out / written).exists() or site.startswith("capture/steps")
    # whatever was kept is readable by `opscope report` (it rebuilds scan.json when there is none)
    if not (out / "scan.json").exists():
        report = run_opscope("report", out, "--format", "html")
        assert report.returncode == 0, report.stderr[-3000:]
    read_scan_json(out / "scan.json")
    assert _complete_steps(out) == list(range(1, kept + 1))
    if site.startswith("traces/"):   # the step whose trace failed is not half kept
        assert sorted(p.name for p in (out / "traces").iterdir()) == ["step_0001.json", "step_0002.json"]


def test_an_io_error_says_so_and_asks_to_check_the_file_system(tmp_path):
    out = tmp_path / "run"
    proc = _scan(out, 3, "--format", "", env={"OPSCOPE_FAIL_WRITE": "capture/steps.jsonl@2",
                                             "OPSCOPE_FAIL_WRITE_ERRNO": "EIO"})
    assert proc.returncode == EXIT_WRITE_FAILED, proc.stderr[-3000:]
    (line,) = _opscope_lines(proc.stderr)
    assert "input/output error writing" in line and "check that file system" in line
    assert _complete_steps(out) == [1]


def _mount_tmpfs(path: Path, size: str) -> bool:
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def test_a_disk_that_fills_after_a_few_steps(tmp_path):
    """The real thing: --out on a tmpfs that holds about three steps' traces."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "700k"):
        pytest.skip("cannot mount a tmpfs here (needs root on Linux)")
    try:
        out = disk / "x"
        proc = _scan(out, 8, "--format", "html")
        assert proc.returncode == EXIT_WRITE_FAILED, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and "Error" not in proc.stdout
        lines = _opscope_lines(proc.stderr)
        assert lines[0].startswith("opscope: warning: ") and "free" in lines[0]   # said after step 1
        assert len(lines) == 2 and lines[1].startswith("opscope: error: no space left on device writing ")
        _no_half_files(out)
        assert not (out / "capture" / run_folder.RESERVE).exists()
        kept = int(lines[1].split(" complete step")[0].rsplit("(", 1)[1])
        assert kept >= 1 and len(_complete_steps(out)) == kept
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# -- opscope killed ----------------------------------------------------------------------------
def _alive(pattern: str) -> list[int]:
    """Processes (not this test's) whose command line names ``pattern``: the scan's own files."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:   # the command line, or the environment: a capture child started early names no file
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
                cmdline += open(f"/proc/{entry}/environ", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if pattern in cmdline:
                pids.append(int(entry))
    return pids


def _lines(path: Path) -> int:
    try:
        return len(path.read_bytes().splitlines())
    except OSError:
        return 0


def _whole_lines(path: Path) -> int:
    """Lines of a JSON-lines file that parse (a line cut by a kill does not)."""
    count = 0
    for line in path.read_bytes().splitlines():
        try:
            json.loads(line)
        except ValueError:
            break
        count += 1
    return count


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_opscope_then_report_recovers_the_captured_steps(tmp_path):
    out = tmp_path / "run"
    (tmp_path / "notes.txt").write_text("mine")
    proc = subprocess.Popen(_scan_cmd(out, 40, "--format", "", pause=0.2), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, OPSCOPE_TEST_RUN=str(out)))   # names the run's processes
    steps_log = out / "capture" / "steps.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _lines(steps_log) < 6:
        time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline and _alive(str(out)):
        time.sleep(0.2)
    assert not _alive(str(out)), "a process of the killed scan is still running"
    assert _alive(str(SCRIPT)) == [], "the script outlived the killed scan"
    assert not (out / "scan.json").exists()
    captured = _whole_lines(steps_log)   # the kill can land mid-write: a cut last line is not a captured step
    assert captured >= 6

    report = run_opscope("report", out, "--format", "html")
    assert report.returncode == 0, report.stderr[-3000:]
    assert "took over the lock" in report.stderr and "Traceback" not in report.stderr
    scan = json.loads((out / "scan.json").read_text())
    assert scan["complete"] is False
    assert scan["incomplete_reason"] == f"recovered: the scan process was killed during step {captured + 1}"
    assert len(_complete_steps(out)) == captured and (out / "report.html").exists()
    assert scan["operators"] and scan["script"] == str(SCRIPT)
    import torch
    assert scan["torch_version"] == torch.__version__   # the scan's torch, read without importing it

    # the step log's last line cut in half (killed mid-write): dropped with a note, the rest kept
    data = b"".join(line + b"\n" for line in steps_log.read_bytes().splitlines()[:captured])
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
    steps_log.write_bytes(data[: len(data) - 1 - len(last) // 2])
    (out / "scan.json").unlink()
    report = run_opscope("report", out, "--format", "html")
    assert report.returncode == 0, report.stderr[-3000:]
    assert _complete_steps(out) == list(range(1, captured))
    notes = json.loads((out / "scan.json").read_text())["notes"]
    assert any(f"line {captured} was cut short" in n for n in notes), notes

    # a new scan into the killed scan's folder leaves exactly its own files
    (out / "my_notes.txt").write_text("mine")
    again = _scan(out, 3, "--format", "")
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(p.name for p in (out / "traces").iterdir()) == ["step_0001.json", "step_0002.json",
                                                                    "step_0003.json"]
    assert not (out / "report.html").exists() and (out / "my_notes.txt").read_text() == "mine"
    assert _complete_steps(out) == [1, 2, 3]


def test_recovery_of_a_rank_folder_uses_the_run_folders_configuration(tmp_path):
    """Spawned ranks write rankN/ without a config of their own: recovery takes the run's, as rank N."""
    out = tmp_path / "run"
    assert _scan(out, 2, "--format", "").returncode == 0
    rank = out / "rank1"
    shutil.copytree(out / "capture", rank / "capture")
    (rank / "capture" / "config.json").unlink()
    (rank / "capture" / "outcome.json").unlink()
    (out / "scan.json").unlink()
    report = run_opscope("report", out, "--format", "md")
    assert report.returncode == 0, report.stderr[-3000:]
    scan = json.loads((rank / "scan.json").read_text())
    assert scan["settings"]["rank"] == 1 and len(scan["steps"]) == 2
    assert scan["incomplete_reason"] == "recovered: the scan process was killed"


def test_a_rank_that_cannot_write_ends_the_distributed_scan_and_every_rank_recovers(tmp_path):
    """torchrun-style, every rank captured: rank 1's disk error ends the run (one line, exit 7);
    with the scan.json files gone (a killed scan), `report` rebuilds rank 0's and rank 1's."""
    out = tmp_path / "run"
    env = dict(os.environ, OPSCOPE_FAIL_WRITE="rank1/traces/step_0002.json")
    proc = subprocess.run([sys.executable, "-m", "opscope", "scan", str(SCRIPTS / "ddp_torchrun_train.py"),
                           "--steps", "4", "--ranks", "all", "--out", str(out), "--quiet", "--format", ""],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == EXIT_WRITE_FAILED, proc.stderr[-3000:]
    (line,) = _opscope_lines(proc.stderr)
    assert line.startswith(f"opscope: error: rank 1: no space left on device writing {out}/rank1/traces/step_0002.json")
    assert sorted(p.name for p in (out / "rank1" / "traces").iterdir()) == ["step_0001.json"]
    _no_half_files(out)
    for folder in (out, out / "rank1"):
        (folder / "scan.json").unlink()
        (folder / "capture" / "outcome.json").unlink()   # as if opscope was killed
    report = run_opscope("report", out, "--format", "md")
    assert report.returncode == 0, report.stderr[-3000:]
    rank1 = json.loads((out / "rank1" / "scan.json").read_text())
    assert rank1["settings"]["rank"] == 1 and [s["index"] for s in rank1["steps"]] == [1]
    assert rank1["incomplete_reason"].startswith("recovered: the scan process was killed during step 2")
    assert json.loads((out / "scan.json").read_text())["incomplete_reason"].startswith("recovered: ")


# -- one scan per folder -------------------------------------------------------------------------
def test_two_scans_into_one_folder_exactly_one_runs(tmp_path):
    out = tmp_path / "same"
    procs = [subprocess.Popen(_scan_cmd(out, steps, "--format", "", pause=0.3), cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for steps in (3, 5)]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, EXIT_USAGE], results
    winner = next(i for i, (code, _) in enumerate(results) if code == 0)
    loser_err = results[1 - winner][1]
    (line,) = _opscope_lines(loser_err)
    assert f"{out} is being written by another scan (pid {procs[winner].pid}, started " in line
    assert line.endswith("; choose another --out")
    assert len(_complete_steps(out)) == (3, 5)[winner]
    assert not (out / run_folder.LOCK).exists()


def test_report_into_a_folder_being_scanned_is_refused(tmp_path):
    out = tmp_path / "run"
    assert _scan(out, 1, "--format", "").returncode == 0
    with run_folder.lock(out, "scan"):
        report = run_opscope("report", out, "--format", "html")
        verify = run_opscope("verify", out, "--device", "cpu")
    for proc in (report, verify):
        assert proc.returncode == EXIT_USAGE, proc.stderr[-2000:]
        (line,) = _opscope_lines(proc.stderr)
        assert f"is being written by another scan (pid {os.getpid()}, started " in line
    assert not (out / "report.html").exists()


def test_lock_refuses_a_second_holder_and_takes_over_a_dead_ones(tmp_path):
    held = run_folder.lock(tmp_path, "scan")
    with pytest.raises(UserError) as refused:
        run_folder.lock(tmp_path, "scan")
    assert refused.value.exit_code == EXIT_USAGE and f"pid {os.getpid()}" in str(refused.value)
    held.release()
    assert not (tmp_path / run_folder.LOCK).exists()
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / run_folder.LOCK).write_text(json.dumps({"pid": gone.pid, "host": "h", "started": 0,
                                                        "what": "scan"}))
    with run_folder.lock(tmp_path, "report") as taken:
        assert taken.note and f"pid {gone.pid}" in taken.note and "gone" in taken.note
        holder = json.loads((tmp_path / run_folder.LOCK).read_text())
        assert holder["pid"] == os.getpid() and holder["what"] == "report"


# -- re-scans replace, never mix -------------------------------------------------------------------
def test_a_shorter_rescan_leaves_only_its_own_files(tmp_path):
    out = tmp_path / "run"
    assert _scan(out, 8, "--format", "html,md").returncode == 0
    (out / "mine.txt").write_text("mine")
    (out / "traces" / "my_trace.json").write_text("{}")
    proc = _scan(out, 3, "--format", "html")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (out / "traces").iterdir()) == ["my_trace.json", "step_0001.json",
                                                                    "step_0002.json", "step_0003.json"]
    assert not (out / "report.md").exists() and (out / "report.html").exists()
    assert (out / "mine.txt").read_text() == "mine"


def test_clear_previous_scan_removes_opscope_files_only(tmp_path):
    for rel in ("scan.json", "operators.csv", "report.xlsx", "traces/step_0001.json", "traces/.step_0002.json.x1.tmp",
                ".scan.json.ab12.tmp", "capture/steps.jsonl", "capture/config.json", "capture/ranks/rank3/capture/outcome.json",
                "capture/fake.json",   # a --mode fake scan's record: a real re-scan must not fold it in
                "capture/launcher/capture/steps.jsonl", "rank1/scan.json", "rank1/capture/steps.jsonl",
                "rank1/traces/step_0001.json", "rank2/capture/runtime.json",
                # the user's own files
                "notes.txt", "traces/keep.json", "rank1/mine.txt", "rankings/scan.json", "capture/mine.txt",
                "e2e/e2e.json"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    run_folder.RunFolder(tmp_path).clear_previous_scan(["report.html", "report.xlsx"])
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["capture/mine.txt", "e2e/e2e.json", "notes.txt", "rank1/mine.txt", "rankings/scan.json",
                    "traces/keep.json"]
    assert not (tmp_path / "rank2").exists() and not (tmp_path / "capture" / "launcher").exists()


def test_space_warning_after_the_first_step(tmp_path, monkeypatch):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "step_0001.json").write_bytes(b"x" * 2 * 2**20)
    monkeypatch.setattr(run_folder, "free_bytes", lambda path: 5 * 2**20)
    warning = run_folder.space_warning(tmp_path, 1, 10)
    assert warning and "5.0 MB free" in warning and "--steps 10" in warning
    monkeypatch.setattr(run_folder, "free_bytes", lambda path: 100 * 2**20)
    assert run_folder.space_warning(tmp_path, 1, 10) is None


def test_the_step_log_never_keeps_half_a_line(tmp_path, monkeypatch):
    from opscope.atomic import AppendLog
    monkeypatch.setenv("OPSCOPE_FAIL_WRITE", "steps.jsonl@2")
    log = AppendLog(tmp_path / "steps.jsonl")
    log.append('{"step": 1}\n')
    with pytest.raises(OSError):
        log.append('{"step": 2}\n')
    log.close()
    assert (tmp_path / "steps.jsonl").read_text() == '{"step": 1}\n'


def _started(cmd: list[str], out: Path, steps: int) -> subprocess.Popen:
    """A scan started in the background, once its step log holds ``steps`` lines (or after 200 s)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and _lines(out / "capture" / "steps.jsonl") < steps:
        time.sleep(0.1)
    return proc


def test_sigterm_handling_is_unchanged_by_the_lock(tmp_path):
    """SIGTERM to opscope still writes what was captured, and releases the folder."""
    out = tmp_path / "run"
    proc = _started(_scan_cmd(out, 40, "--format", "", pause=0.2), out, 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert not (out / run_folder.LOCK).exists() and len(_complete_steps(out)) >= 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_while_the_script_stops_still_reports_the_captured_steps(tmp_path, sig):
    """Ctrl-C pressed twice, or a supervisor repeating SIGTERM: the second signal reaches opscope while the script
    writes what it captured.  It ends the script at once; opscope still reports the whole steps, exits with the
    first signal's code, prints no traceback and leaves no process behind."""
    out = tmp_path / "run"
    proc = _started(_scan_cmd(out, 40, "--format", "", pause=0.2), out, 2)
    proc.send_signal(sig)
    time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert not (out / run_folder.LOCK).exists() and len(_complete_steps(out)) >= 2
    assert _alive(str(out)) == []


def test_a_signal_the_caller_ignores_stays_ignored(tmp_path):
    """A scan started with SIGINT ignored (a shell's background job, ``trap '' INT``) runs on through it."""
    out = tmp_path / "run"
    cmd = _scan_cmd(out, 6, "--format", "", pause=0.2)
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and _lines(out / "capture" / "steps.jsonl") < 2:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=200)
    assert proc.returncode == 0, err[-2000:]
    assert _complete_steps(out) == [1, 2, 3, 4, 5, 6]


def test_a_repeated_sigterm_to_a_distributed_scan_keeps_the_ranks_reports(tmp_path):
    """torchrun-style: SIGTERM twice while the ranks run.  The second arrives while they write their own reports;
    it does not cut them short: rank 0's scan.json is written, no traceback, opscope ends by SIGTERM as with one."""
    out = tmp_path / "run"
    proc = _started([sys.executable, "-m", "opscope", "scan", str(SCRIPTS / "ddp_torchrun_train.py"), "--steps", "400",
                     "--out", str(out), "--quiet", "--format", "", "--", "--epochs", "100", "--samples", "640"], out, 3)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=200)
    assert proc.returncode == -signal.SIGTERM and "Traceback" not in err, err[-2000:]
    assert len(_complete_steps(out)) >= 2
    assert _alive(str(out)) == []


def test_a_retry_waits_for_the_attempt_still_holding_the_folder(tmp_path):
    """A fleet retry of a job whose previous attempt is still writing its partial results waits for it."""
    import threading
    held = run_folder.lock(tmp_path, "scan")
    assert run_folder.wait_for_release(tmp_path, 0.3) is False   # still held: gives up after the timeout
    threading.Timer(0.5, held.release).start()
    started = time.monotonic()
    assert run_folder.wait_for_release(tmp_path, 10) is True
    assert 0.4 < time.monotonic() - started < 5
    assert run_folder.wait_for_release(tmp_path / "never-scanned", 0) is True


def test_a_second_scans_write_probe_in_the_same_moment_is_not_a_missing_folder(tmp_path, monkeypatch):
    """Two scans started together both probe --out before either takes the lock: the second one's
    probe, written and removed between this scan's write and unlink, must not fail this one
    ("cannot write to --out ...: No such file or directory" instead of the lock's own message)."""
    from opscope.scanning import check_out
    out = tmp_path / "same"
    write_text, nested = Path.write_text, []

    def write_then_other_scan_probes(self, *args, **kwargs):
        result = write_text(self, *args, **kwargs)
        if self.name.startswith(".opscope-write-test") and not nested:
            nested.append(self)
            check_out(out)     # the other scan's whole probe, in between
        return result

    monkeypatch.setattr(Path, "write_text", write_then_other_scan_probes)
    check_out(out)
    assert nested and not any(out.iterdir())


def test_a_recovered_scan_names_the_torch_its_script_ran_with(tmp_path):
    """outcome.json records the capture child's torch; recovery reports it, not the reporting process's."""
    from opscope.pipeline import recover_capture
    out = tmp_path / "run"
    done = _scan(out, 2, "--format", "")
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads((out / "capture" / "outcome.json").read_text())
    import torch
    assert outcome["torch"] == torch.__version__
    outcome["torch"] = "2.9.9+scan"
    (out / "capture" / "outcome.json").write_text(json.dumps(outcome))
    (out / "scan.json").unlink()
    assert recover_capture(out).torch_version == "2.9.9+scan"


def test_report_of_a_killed_scan_does_not_import_torch(tmp_path):
    """The capture resolves each call's overload where torch is imported; rebuilding scan.json from the run
    folder (a killed scan) reads files only: the same operators, and torch never imported."""
    out = tmp_path / "run"
    done = _scan(out, 2, "--format", "")
    assert done.returncode == 0, done.stderr[-3000:]
    before = json.loads((out / "scan.json").read_text())
    (out / "scan.json").unlink()
    code = ("import sys\nfrom opscope.cli import main\n"
            "try:\n    main(['report', sys.argv[1], '--format', 'html,md'])\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\nprint('torch imported' if 'torch' in sys.modules else 'no torch')\n")
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "no torch"
    after = json.loads((out / "scan.json").read_text())

    def signatures(scan):
        return sorted(str((o["name"], o.get("overload"), o["input_shapes"], o["verdict"])) for o in scan["operators"])
    assert signatures(after) == signatures(before) and any(o.get("overload") for o in after["operators"])
