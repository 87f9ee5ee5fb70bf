"""Several `dpot-train` commands in one fresh process, each through the CLI as a user types it: the environment is
read once at start (huggingface_hub reads its own when imported), as a separate process per command would read it,
at the cost of one interpreter start instead of one per command.

`run_batch(calls, env)` returns one `subprocess.CompletedProcess` per call (args, exit code, stdout, stderr)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence

from tests import train_runs


def run_batch(calls: Sequence[Sequence[str]], env: Mapping[str, str] | None = None,
              timeout: float = 600) -> list[subprocess.CompletedProcess[str]]:
    """Run each call (`dpot-train` arguments) in order in one new `python -m tests.cli_batch` process."""
    r = subprocess.run([sys.executable, "-m", "tests.cli_batch"], input=json.dumps([list(c) for c in calls]),
                       capture_output=True, text=True, timeout=timeout, env=dict(env or train_runs.env()),
                       cwd=train_runs.ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.splitlines()[-1])
    return [subprocess.CompletedProcess(["dpot-train", *c], res["code"], res["stdout"], res["stderr"])
            for c, res in zip(calls, results)]


def main() -> None:
    """Read the calls (a JSON list of argument lists) from stdin; print their results as one JSON line."""
    from typer.testing import CliRunner

    from dpot_train.cli import app

    out = []
    for args in json.loads(sys.stdin.read()):
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception  # a traceback is a failure of the command, not a result
        out.append({"code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
