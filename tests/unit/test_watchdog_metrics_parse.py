"""Rank 0's /metrics as the sidecar reads it: summed over labels, and only finite numbers kept.

Real SGLang exports gauges whose value is NaN (seen on the local-sglang seat); a NaN in a metrics record made
every capture of that seat fail, since a bundle's JSON cannot hold it.
"""

from __future__ import annotations

import json

from sgl_seat.core.records import MetricsPoint
from sgl_seat.forensics.format.codec import encode_records
from sgl_seat.watchdog.sources import parse_metrics_text

TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="tiny",tp_rank="0"} 2.0
sglang:num_running_reqs{model_name="tiny",tp_rank="1"} 1.0
# HELP sglang:spec_accept_rate The acceptance rate.
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{model_name="tiny"} NaN
# HELP sglang:gen_throughput The generation throughput.
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="tiny"} +Inf
# HELP other_metric Not SGLang's.
# TYPE other_metric gauge
other_metric 5.0
"""


def test_values_are_summed_over_labels_and_non_finite_ones_left_out() -> None:
    values = parse_metrics_text(TEXT, "sglang:")
    assert values == {"sglang:num_running_reqs": 3.0}


def test_a_point_from_such_a_scrape_is_written_into_a_bundle() -> None:
    point = MetricsPoint(t=1.0, node=0, values=parse_metrics_text(TEXT, "sglang:"))
    line = encode_records([point]).decode()
    assert '"sglang:num_running_reqs":3.0' in line
    assert MetricsPoint.from_json(json.loads(line)) == point
