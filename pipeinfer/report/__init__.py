"""What a run leaves behind: metrics.py (a generation's timings and counters, the CSV row)
-> summary.py (the --json object and the summary line) -> results.py (CSVs read back and
summarised; charts.py draws them) and timeline.py (the picture of a --trace file)."""
