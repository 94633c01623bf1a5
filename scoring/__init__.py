"""The scoring side of kern-prompts: record a reference on a split, judge a candidate engine.

    trace.py     kern's trace table and its schedule as data; reading (streaming) and writing
    rows.py      the rows of a split (a build's OUT or the published dataset), chosen and rendered
    engines/     the engine interface (engines/__init__.py) and one module per engine
    record.py    driving an engine over a corpus: sampling, teacher forcing, staging, resuming, merge
    compare.py   the judge's arithmetic: estimators, band, verdicts, strata, drift (arrays in,
                 numbers out)
    report.py    the report's lines, JSON, the positions table, the plot
    judge.py     the judge command: two traces read together (or a candidate run here), judged,
                 reported
    paths.py     every path a command names, checked before any work: no output an input,
                 every output writable where it is named

    boundary.py  everything an engine gives, checked before it is staged or judged
    builder.py   a link to build.py: the builder's facts and helpers (splits, sources,
                 sha256_file, stem, not_utf8), installed with the package (its one file kept)

Imports run one way: score.py -> record, judge -> report -> compare -> trace; engines import only
the interface (engines/__init__.py) and trace.py; any of them may use build.py's shared helpers
(sha256_file, stem, not_utf8) rather than a copy, as `scoring.builder`, so that the package
imports wherever it is installed (a wheel holds the link's target). torch, transformers and matplotlib are imported
only where they are used, so `import scoring.trace` needs the base install alone.
"""
