"""How fast and how right the analysis is: throughput, analyze, the compare and boundary thresholds, HTA."""
