from setuptools import find_packages, setup

setup(
    name="pyspark-kafkalog",
    version="0.1.0",
    description="Read and write Apache Kafka's on-disk log format on shared storage from Spark, "
                "without brokers",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["pyspark_kafkalog", "pyspark_kafkalog.*"]),
    install_requires=[
        "pyspark>=4.0",
        "pyarrow>=15",
        "numpy>=1.24",
        "crc32c>=2.3",
        "lz4>=4.0",
        "zstandard>=0.21",
        "cramjam>=2.7",
        "fsspec>=2024.2",
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
        ],
        "s3": ["s3fs>=2024.2"],
    },
    entry_points={"console_scripts": ["kafkalog=pyspark_kafkalog.cli.main:main"]},
)
