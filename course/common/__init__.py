"""The shared vocabulary every room imports: where things live (``paths``), notebooks and their metadata, the
grading job and its result, the score model, outcomes, quoting for CSV and logs, measure declarations. No side
effects at import; imports nothing from the other rooms."""
