"""What the Spark tests share besides the ``spark``/``ks`` fixtures (tests/conftest.py)."""
from __future__ import annotations


def write(df, root, **opts):
    """``df.write.format("kafkalog")`` to cluster ``root`` with ``opts`` as options."""
    w = df.write.format("kafkalog").mode("append")
    for k, v in opts.items():
        w = w.option(k, str(v))
    w.save(str(root))
