"""`dflash-bench report`: one self-contained HTML page and figures/*.png from one or more sweep folders.

    from dflash_bench.report import build_report
    build_report([Path("reports/h100"), Path("reports/b300")], out=Path("compare.html"))
"""

from dflash_bench.report.page import build_report

__all__ = ["build_report"]
