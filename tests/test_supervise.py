"""The convergence runner's supervisor: whatever ends it ends the trainer it started."""

import os
import signal
import subprocess
import sys
import time

from specforge_outlets.training.resumable import supervise

# a stand-in trainer: writes its pid, then sleeps far longer than any test
SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
# a supervisor process, so that SIGTERM reaches it and not pytest
SUPERVISOR = ("import os, sys; from specforge_outlets.training.resumable import supervise; "
              "sys.exit(supervise([sys.executable, '-c', sys.argv[1], sys.argv[2]], os.environ, 0.05, lambda: False))")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(path, timeout=30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and open(path).read():
            return int(open(path).read())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_the_trainer_exit_code_comes_back():
    assert supervise([sys.executable, "-c", "raise SystemExit(3)"], os.environ, 0.05, lambda: False) == 3


def test_a_stop_ends_the_trainer(tmp_path):
    pid_file = tmp_path / "pid"
    polls = []

    def should_stop():
        polls.append(1)
        return pid_file.exists() and bool(pid_file.read_text())

    assert supervise([sys.executable, "-c", SLEEPER, str(pid_file)], os.environ, 0.05, should_stop) == 0
    assert polls and not alive(int(pid_file.read_text()))


def test_sigterm_to_the_supervisor_ends_the_trainer_too(tmp_path):
    pid_file = tmp_path / "pid"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, SLEEPER, str(pid_file)], env=env)
    trainer = wait_for(pid_file)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while alive(trainer) and time.monotonic() < deadline:  # reaped by the supervisor's wait
        time.sleep(0.05)
    assert not alive(trainer), "the trainer outlived its supervisor"
