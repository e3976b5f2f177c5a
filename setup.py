import sys
import warnings

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build the C accelerator if possible, else warn and go on.

    ``pyspark_kafkalog.format.accel`` falls back to the pure-Python/numpy twins (same results,
    slower) when an extension is missing, so a machine without a compiler must still install.
    """

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure only costs speed
            self._skip(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._skip(exc, ext.name)

    @staticmethod
    def _skip(exc, name="C extensions"):
        msg = (f"pyspark-kafkalog: could not build {name} ({exc}); using the pure-Python "
               "decoder, which gives the same results more slowly")
        warnings.warn(msg)
        print(msg, file=sys.stderr)


setup(
    name="pyspark-kafkalog",
    version="0.1.0",
    description="Read and write Apache Kafka's on-disk log format on shared storage from Spark, "
                "without brokers",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["pyspark_kafkalog", "pyspark_kafkalog.*"]),
    # the C extensions' type stubs (format/accel.py loads the extensions)
    package_data={"pyspark_kafkalog.format": ["*.pyi"]},
    ext_modules=[Extension("pyspark_kafkalog.format._columnar_accel",
                           ["pyspark_kafkalog/format/_columnar_accel.c",
                            "pyspark_kafkalog/format/_columnar_arrow.c"],
                           depends=["pyspark_kafkalog/format/_columnar_parse.h",
                                    "pyspark_kafkalog/format/_batch_layout.h",
                                    "pyspark_kafkalog/format/_pool.h"], optional=True),
                 Extension("pyspark_kafkalog.format._encode_accel",
                           ["pyspark_kafkalog/format/_encode_accel.c"],
                           depends=["pyspark_kafkalog/format/_pool.h",
                                    "pyspark_kafkalog/format/_encode_common.h",
                                    "pyspark_kafkalog/format/_encode_accumulate.h",
                                    "pyspark_kafkalog/format/_encode_murmur2.h",
                                    "pyspark_kafkalog/format/_encode_cleaner.h"],
                           optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
    install_requires=[
        "pyspark>=4.0",
        "pyarrow>=15",
        "numpy>=1.24",
        "crc32c>=2.3",
        "lz4>=4.0",
        "zstandard>=0.21",
        "cramjam>=2.7",
        "fsspec>=2024.2",
        # the coordinator service only (pyspark_kafkalog/coordinator: RPC and metrics); nothing
        # else imports them
        "grpcio>=1.59",
        # the coordinator RPC's messages (coordinator/kafkalog_rpc_pb2.py); the generated module
        # checks the runtime: same major version, at least the protoc's that generated it
        "protobuf>=7.35.1,<8",
        "prometheus-client>=0.20",
    ],
    extras_require={
        "test": [
            "pytest>=7",
            "hypothesis>=6.80",
            "kafka-python>=2.1",
            "xxhash>=3",
            "cramjam>=2.7",
            "s3fs>=2024.2",
            "moto[server]>=5",
            # moto asks for any boto3 and s3fs's aiobotocore pins botocore to a narrow range; left
            # open, pip takes the newest boto3 first and then backtracks through dozens of
            # aiobotocore and boto3 releases (52 s and "This is taking longer than usual" on a
            # fresh venv). These bounds are the newest that aiobotocore supports today, so pip
            # resolves in one pass; move them up together when aiobotocore moves.
            "aiobotocore>=3.10",
            "botocore>=1.43.115,<1.43.118",
            "boto3>=1.43.115,<1.43.118",
            # regenerates coordinator/kafkalog_rpc_pb2.py (tools/gen_rpc_proto.py; a test checks
            # the committed one is current); pinned, since another protoc writes other bytes
            "grpcio-tools==1.85.1",
        ],
        "s3": ["s3fs>=2024.2"],
    },
    entry_points={"console_scripts": ["kafkalog=pyspark_kafkalog.cli.main:main"]},
)
