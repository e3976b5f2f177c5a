"""What the command-line tests share: `kafkalog` as a real process, and a digest of every file
under a root (to show that a refused command changed nothing)."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

REPO = Path(__file__).resolve().parents[1]


def run_cli(*argv, stdin: str = "", env: Optional[dict] = None, timeout: int = 180):
    """``kafkalog ARGV`` in a fresh interpreter: (exit status, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "pyspark_kafkalog.cli.main", *map(str, argv)],
                          input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**(os.environ if env is None else env), "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stdout, proc.stderr


def digests(root: Path) -> Dict[str, str]:
    """sha256 of every file under ``root``, by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}
