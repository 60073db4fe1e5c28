"""CI: installing any extra of dsv4ops never changes the installed torch.

Run inside a virtual environment that holds torch (.ci/run does it next to the oldest and the newest torch
it tests). For every extra in pyproject.toml, pip's resolver plans ``pip install ".[extra]"`` with
``--dry-run --report -`` (metadata only, nothing downloaded but what pip needs to read requirements) and
the plan must not install torch. An extra whose plan pip cannot make is reported, not failed (that is
a registry or network problem, not a torch swap). Exit status 1 when some extra would change torch."""
import json
import pathlib
import subprocess
import sys
import tomllib
from importlib.metadata import version

ROOT = pathlib.Path(__file__).resolve().parent.parent


def planned(extra: str) -> dict[str, str] | str:
    """name -> version pip would install for ``.[extra]``, or pip's error (last line)."""
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                          f".[{extra}]"], cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        return (run.stderr.strip().splitlines() or ["pip failed"])[-1]
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(run.stdout)["install"]}


def main() -> int:
    torch_version = version("torch")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    swapped = []
    for extra in extras:
        plan = planned(extra)
        if isinstance(plan, str):
            print(f"== extras: [{extra}] not checked: pip could not resolve it ({plan})")
        elif "torch" in plan:
            swapped.append(extra)
            print(f"== extras: [{extra}] FAILS: would replace torch {torch_version} by {plan['torch']} "
                  f"(plan: {', '.join(f'{n} {v}' for n, v in sorted(plan.items()))})")
        else:
            print(f"== extras: [{extra}] keeps torch {torch_version} ({len(plan)} to install)")
    return 1 if swapped else 0


if __name__ == "__main__":
    sys.exit(main())
