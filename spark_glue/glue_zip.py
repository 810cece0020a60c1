"""Build the zip that Glue adds to ``sys.path`` (``--extra-py-files``): the `delayq_reports`
package without its local-only modules. Byte-for-byte reproducible: sorted entries, fixed times.

`sam deploy` ships it: the `GlueCode` custom resource (``glue_code.py``) builds it with
`archive` and puts it to ``s3://<AnalyticsBucket>/glue/delayq_reports.zip``.

Usage: ``python spark_glue/glue_zip.py build/glue/delayq_reports.zip`` (``make glue-zip``), to
look at it or to upload it by hand.
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "delayq_reports"
# Local runs, the benchmark and test helpers; the Glue jobs never import them.
LOCAL_ONLY = frozenset({"local_spark.py", "bench.py", "synthetic_exports.py"})
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def archive(package: Path = PACKAGE) -> tuple[bytes, list[str]]:
    """The zip's bytes and the names it holds."""
    sources = sorted(p for p in package.glob("*.py") if p.name not in LOCAL_ONLY)
    if not sources:
        raise FileNotFoundError(f"no modules in {package}")
    buffer = io.BytesIO()
    names = []
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
        for source in sources:
            info = zipfile.ZipInfo(f"{package.name}/{source.name}", date_time=FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zipped.writestr(info, source.read_bytes())
            names.append(info.filename)
    return buffer.getvalue(), names


def build(target: Path) -> list[str]:
    """Write the zip to `target` and return the names it holds."""
    data, names = archive()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return names


def main(argv: list[str]) -> int:
    """Build the zip named by the only argument."""
    if len(argv) != 2:
        sys.stderr.write(f"usage: {argv[0]} <target.zip>\n")
        return 2
    names = build(Path(argv[1]))
    sys.stdout.write(f"{argv[1]}: {len(names)} modules\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
