"""The package as a user installs it: `pip install .` (a wheel, not the editable checkout), then `outlets demo --quick`
run from another directory, so that nothing it needs is found only relative to a checkout (recipes ship inside it)."""

import os
import subprocess
import sys
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def clean_copy(destination: str) -> str:
    """The repository's files as a fresh clone has them (no build/ left over from an earlier build)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.split("\n")
    os.makedirs(destination)
    archive = os.path.join(os.path.dirname(destination), "source.tar")
    with tarfile.open(archive, "w") as tar:
        for name in filter(None, listed):
            if os.path.isfile(os.path.join(REPO, name)) and not name.startswith(("runs/", "benchmarks/data/")):
                tar.add(os.path.join(REPO, name), arcname=name)
    with tarfile.open(archive) as tar:
        tar.extractall(destination)
    return destination


def test_an_installed_package_runs_the_quick_demo_from_another_directory(tmp_path):
    source = clean_copy(str(tmp_path / "source"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), source], check=True)
    assert (site / "specforge_outlets" / "recipes" / "smollm2-135m-cpu-outlets.yaml").is_file()
    assert (site / "specforge_outlets" / "scripts" / "build-llama-server.sh").is_file()  # named by its error
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of the checkout's editable install
    where = subprocess.run([sys.executable, "-c", "import specforge_outlets; print(specforge_outlets.__file__)"],
                           cwd=elsewhere, env=env, check=True, capture_output=True, text=True).stdout.strip()
    assert where.startswith(str(site)), where
    result = subprocess.run([str(site / "bin" / "outlets"), "demo", "--quick", "--output", "run"], cwd=elsewhere,
                            env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "length prediction on" in result.stdout and "outlets" in result.stdout
    assert (elsewhere / "run" / "stages").is_dir()
