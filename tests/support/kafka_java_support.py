"""Apache Kafka's own Java classes as a test oracle: build them from Kafka's sources, run a check.

``tests/kafka_java/KafkaLogCheck.java`` reads a log dir with Kafka's record, index and checkpoint
classes (``FileRecords``, ``OffsetIndex``, ``TimeIndex``, ``OffsetCheckpointFile`` …) and prints
what they saw as JSON lines; ``KafkaPartitioner.java`` gives the partition Kafka's Java producer
picks for a key. No Kafka jar is needed: the classes are compiled with ``javac`` from a
Kafka source tree, and the codecs they call come from the jars PySpark already ships (lz4-java,
snappy-java, zstd-jni), which are the libraries Kafka itself uses.

Where the Kafka sources come from, in order:

1. ``$KAFKALOG_KAFKA_SOURCE``: a Kafka checkout, a git repository of it (bare or not), or a
   ``.tar.gz`` of its tree;
2. ``kafka-src/kafka-src.tar.gz`` in the shared dir beside the repository (``shared_paths``): the
   subset of Kafka's tree the check needs, at a pinned commit, with Kafka's LICENSE and NOTICE.

An archive is unpacked into the build's scratch dir only when a build is needed. The build is
cached under ``$KAFKALOG_KAFKA_JAVA_CACHE`` or ``~/.cache/pyspark-kafkalog/kafka-java``, keyed by
the archive's sha256 (or the checkout's commit) and this harness's sources, so later runs only
start ``java``. With no Kafka sources or no ``javac``, the tests that need it are skipped and say
which, or fail in CI (``shared_paths.missing``).

One change is made to Kafka's sources, to its message *generator* (a build tool, not the classes
under test): the command-line ``main`` and its argparse4j and jackson-jdk8 imports are removed,
because those two jars are not on these machines. ``GenerateMessages.java`` calls the generator's
public ``processDirectories`` instead, as Kafka's build does through that ``main``.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from support.shared_paths import KAFKA_SRC_ARCHIVE

HERE = Path(__file__).resolve().parents[1]          # tests/
JAVA_DIR = HERE / "kafka_java"
# the parts of Kafka's tree the check needs: record classes, generated messages, indexes and
# checkpoints
KAFKA_PATHS = ("clients/src/main/java", "clients/src/main/resources/common/message",
               "generator/src/main/java", "storage/src/main/java", "server-common/src/main/java")
JARS = ("lz4-java", "snappy-java", "zstd-jni", "slf4j-api", "jackson-core", "jackson-databind",
        "jackson-annotations")


class Unavailable(Exception):
    """Why Kafka's classes cannot be built here (the tests skip with this as the reason)."""


def kafka_source() -> tuple[Path, str]:
    """(the Kafka source tree, git dir or archive, a key that changes when its contents do)."""
    if os.environ.get("KAFKALOG_KAFKA_SOURCE"):
        c = Path(os.environ["KAFKALOG_KAFKA_SOURCE"])
        found = _source_at(c)
        if found is None:   # an explicit choice that does not work is not quietly replaced
            raise Unavailable(f"KAFKALOG_KAFKA_SOURCE={c} is not a Kafka checkout, git "
                              "repository or .tar.gz of Kafka's tree")
        return found
    found = _source_at(KAFKA_SRC_ARCHIVE)
    if found is None:
        raise Unavailable(f"no Kafka sources: {KAFKA_SRC_ARCHIVE} is missing (see "
                          "shared_paths.py), and KAFKALOG_KAFKA_SOURCE is not set")
    return found


def _source_at(c: Path) -> tuple[Path, str] | None:
    if c.is_file() and c.name.endswith((".tar.gz", ".tgz")):
        h = hashlib.sha256()
        with open(c, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return c, f"sha256:{h.hexdigest()}"
    if (c / "clients" / "src" / "main" / "java").is_dir():
        head = _git(c, "rev-parse", "HEAD", check=False)
        return c, head or f"tree:{c.resolve()}:{(c / 'clients').stat().st_mtime_ns}"
    if c.is_dir():
        head = _git(c, "rev-parse", "HEAD", check=False)
        if head:
            return c, head
    return None


def _git(repo: Path, *args, check=True) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    if r.returncode != 0:
        if check:
            raise Unavailable(f"git {' '.join(args)} in {repo}: {r.stderr.decode()[-500:]}")
        return ""
    return r.stdout.decode().strip()


def spark_jars() -> list[Path]:
    import pyspark
    jars_dir = Path(pyspark.__file__).parent / "jars"
    found = []
    for stem in JARS:
        hits = sorted(jars_dir.glob(f"{stem}-[0-9]*.jar"))
        if not hits:
            raise Unavailable(f"{stem}*.jar is not in {jars_dir}")
        found.append(hits[-1])
    return found


def build() -> tuple[Path, list[Path]]:
    """Compile (once, then cached) the check against Kafka's sources: (classes dir, jars)."""
    for tool in ("javac", "java"):
        if shutil.which(tool) is None:
            raise Unavailable(f"{tool} is not on PATH (a JDK 17 is needed, not only a JRE)")
    src, key = kafka_source()
    jars = spark_jars()
    h = hashlib.sha256(key.encode())
    for f in sorted(JAVA_DIR.glob("*.java")) + [Path(__file__)]:
        h.update(f.read_bytes())
    h.update(" ".join(j.name for j in jars).encode())
    cache = Path(os.environ.get("KAFKALOG_KAFKA_JAVA_CACHE")
                 or Path.home() / ".cache" / "pyspark-kafkalog" / "kafka-java")
    out = cache / h.hexdigest()[:16]
    if (out / "classes" / "KafkaPartitioner.class").is_file():
        os.utime(out)
        return out / "classes", jars
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
    try:
        _build_into(work, src, jars)
        try:
            os.rename(work, out)           # another build may have won: then use it
        except OSError:
            if not (out / "classes" / "KafkaPartitioner.class").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(cache, keep=out)
    return out / "classes", jars


def _prune(cache: Path, keep: Path, max_age_s: float = 7 * 86400) -> None:
    """Builds for other Kafka commits or older harness sources, unused for a week, go."""
    now = time.time()
    for d in cache.iterdir():
        try:
            if d != keep and d.is_dir() and now - d.stat().st_mtime > max_age_s:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


def _build_into(work: Path, src: Path, jars: list[Path]) -> None:
    tree = work / "kafka"
    tree.mkdir()
    if src.is_file():
        with tarfile.open(src) as tf:
            wanted = [m for m in tf.getmembers()
                      if any(m.name == p or m.name.startswith(p + "/") for p in KAFKA_PATHS)]
            if not wanted:
                raise Unavailable(f"{src} holds none of {', '.join(KAFKA_PATHS)}")
            tf.extractall(tree, members=wanted, filter="data")
    elif (src / "clients" / "src" / "main" / "java").is_dir():
        for p in KAFKA_PATHS:
            shutil.copytree(src / p, tree / p)
    else:
        archive = subprocess.run(["git", "-C", str(src), "archive", "HEAD", *KAFKA_PATHS],
                                 capture_output=True)
        if archive.returncode != 0:
            raise Unavailable(f"git archive in {src}: {archive.stderr.decode()[-500:]}")
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    generator = tree / "generator/src/main/java/org/apache/kafka/message"
    _strip_generator_cli(generator / "MessageGenerator.java")
    cp = os.pathsep.join(map(str, jars))
    gen_classes, gen_src, classes = work / "generator", work / "generated", work / "classes"
    _javac(gen_classes, cp, [*sorted(generator.glob("*.java")), JAVA_DIR / "GenerateMessages.java"])
    _run(["java", "-cp", os.pathsep.join([str(gen_classes), cp]), "GenerateMessages",
          str(tree / "clients/src/main/resources/common/message"),
          str(gen_src / "org/apache/kafka/common/message")])
    sourcepath = os.pathsep.join([str(tree / "clients/src/main/java"), str(gen_src),
                                  str(tree / "storage/src/main/java"),
                                  str(tree / "server-common/src/main/java")])
    _javac(classes, cp, [JAVA_DIR / "KafkaLogCheck.java", JAVA_DIR / "KafkaPartitioner.java"],
           "-sourcepath", sourcepath)
    for scratch in (tree, gen_classes, gen_src):
        shutil.rmtree(scratch)


def _strip_generator_cli(path: Path) -> None:
    text = path.read_text()
    text = re.sub(r"^import (static )?net\.sourceforge\.argparse4j\..*;\n", "", text, flags=re.M)
    text = re.sub(r"^import com\.fasterxml\.jackson\.datatype\.jdk8\.Jdk8Module;\n", "", text,
                  flags=re.M)
    text = text.replace("JSON_SERDE.registerModule(new Jdk8Module());", "")
    main = text.find("    public static void main(String[] args)")
    if main < 0 or "argparse4j" in text[:main] or "Jdk8Module" in text[:main]:
        raise Unavailable(f"{path} is not shaped as expected; the generator's CLI could not be "
                          "set aside")
    path.write_text(text[:main] + "}\n")


def _javac(dest: Path, cp: str, files, *extra) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    _run(["javac", "-nowarn", "-encoding", "UTF-8", "-d", str(dest), "-cp", cp, *extra,
          *map(str, files)])


def _run(cmd, stdin: str | None = None) -> str:
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({r.returncode}):\n{r.stdout[-3000:]}\n"
                           f"{r.stderr[-3000:]}")
    return r.stdout


class KafkaCheck:
    """Runs KafkaLogCheck on a log dir and returns its findings, parsed."""

    def __init__(self, classes: Path, jars: list[Path]):
        self.cp = os.pathsep.join([str(classes), *map(str, jars)])

    def __call__(self, log_dir, *partitions: str) -> "Findings":
        out = _run(["java", "-cp", self.cp, "KafkaLogCheck", str(log_dir), *partitions])
        return Findings([json.loads(line) for line in out.splitlines() if line.strip()])

    def partitions(self, keys, num_partitions: int) -> list:
        """The partition Kafka's Java producer picks for each key (BuiltInPartitioner)."""
        lines = "".join(base64.b64encode(k).decode("ascii") + "\n" for k in keys)
        out = _run(["java", "-cp", self.cp, "KafkaPartitioner", str(num_partitions)], lines)
        return [int(x) for x in out.split()]


class Findings(list):
    """KafkaLogCheck's JSON lines, with the views tests compare against."""

    def kind(self, kind: str) -> list:
        return [d for d in self if d["kind"] == kind]

    def errors(self) -> list:
        return self.kind("error")

    def segments(self, partition: str | None = None) -> list:
        """Per segment: its size, batch count, index entry and lookup counts, and problems."""
        return [d for d in self.kind("segment") if partition in (None, d["partition"])]

    def problems(self, partition: str | None = None) -> list:
        """What a segment's bytes or indexes got wrong, as Kafka's classes see it."""
        return [p for d in self.segments(partition) for p in d["problems"]]

    def batches(self, partition: str | None = None) -> list:
        return [b for b in self.kind("batch") if partition in (None, b["partition"])]

    def records(self, partition: str | None = None) -> list:
        """Every record with its batch's fields, keys and values as bytes, in log order."""
        out = []
        for b in self.batches(partition):
            for r in b["records"]:
                out.append({**{k: v for k, v in b.items() if k != "records"}, **r,
                            "key": _bytes(r["key"]), "value": _bytes(r["value"]),
                            "headers": [(k, _bytes(v)) for k, v in r["headers"]]})
        return out

    def checkpoint(self, name: str) -> dict:
        [d] = [d for d in self.kind("checkpoint") if d["file"] == name]
        return {tp: off for tp, off in d["entries"]}


def _bytes(b64):
    return None if b64 is None else base64.b64decode(b64)
