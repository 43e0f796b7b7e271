"""The package as a user installs it: `pip install .` (a wheel, not the editable checkout), then `outlets demo --quick`
run from another directory, so that nothing it needs is found only relative to a checkout (recipes ship inside it)."""

import os
import subprocess
import sys
import tarfile

import pytest

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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The package installed as a wheel into its own directory (``pip install --target``)."""
    root = tmp_path_factory.mktemp("installed")
    source = clean_copy(str(root / "source"))
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), source], check=True)
    return site


def outlets(site, cwd, *argv):
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of the checkout's editable install
    return subprocess.run([str(site / "bin" / "outlets"), *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_an_installed_package_runs_the_quick_demo_from_another_directory(site, tmp_path):
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


def test_an_installed_package_lists_its_recipes_and_takes_them_by_name_from_anywhere(site, tmp_path):
    shipped = site / "specforge_outlets" / "recipes"
    listed = outlets(site, tmp_path, "recipes")
    assert listed.returncode == 0, listed.stderr
    assert f"recipes shipped in {shipped}" in listed.stdout
    assert f"{shipped / 'llama3.1-8b-outlets.yaml'}" in listed.stdout and "cluster-h100-1p3d " in listed.stdout
    version = outlets(site, tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.strip() == "outlets 0.1.0"  # setup.py's version

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i * 0.5}, "input_length": 100, "output_length": 50}}\n' for i in range(8)))
    simulated = outlets(site, tmp_path, "simulate", "--trace", str(trace), "--config", "cluster-h100-1p3d", "--output",
                        "sim", "--routing", "round-robin", "--queue", "fcfs", "--no-controlled-study")
    assert simulated.returncode == 0, simulated.stderr[-2000:]
    assert "'mode': 'disaggregated'" in (tmp_path / "sim" / "summary.md").read_text()
    # the docs' checkout path, from a directory without one: the installed copy is read (an override it refuses shows it)
    trained = outlets(site, tmp_path, "train", "--config", "recipes/llama3.2-1b-outlets.yaml", "training.no_such_key=1")
    assert trained.returncode == 2 and f"recipe {shipped / 'llama3.2-1b-outlets.yaml'}: override path" in trained.stderr
    missing = outlets(site, tmp_path, "train", "--config", "recipes/llama-99b.yaml")
    assert missing.returncode == 2 and f"the shipped recipes are in {shipped} (list them: outlets recipes" in missing.stderr
