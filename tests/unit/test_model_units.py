"""One grammar for sizes (Kubernetes quantities) and one for durations (Go's), read the same
by run, quota, profile, trace and the agent.  The launcher's C reading of --mem-limit is
held to the same table in tests/smoke/test_conventions.py."""
from __future__ import annotations

import pytest

from seedance.model.errors import BadInput, UsageError
from seedance.model.units import format_duration, format_size, parse_duration, parse_size

# (text, bytes): what a pod spec's resources.limits.memory means by the same words
SIZES = [
    ("8Gi", 8 << 30), ("512Mi", 512 << 20), ("4Ki", 4096), ("1Ti", 1 << 40), ("2Pi", 2 << 50), ("1Ei", 1 << 60),
    ("1G", 10**9), ("1.5G", 1_500_000_000), ("500M", 500_000_000), ("64k", 64_000), ("3T", 3 * 10**12),
    ("1.5Gi", 1610612736), ("4096", 4096), ("1", 1),
    ("8GiB", 8 << 30), ("500MB", 500_000_000), ("100B", 100),
    ("1.5", 2), ("0.1", 1), (".5Ki", 512), ("5.", 5), ("0.0000001Gi", 108),   # fractions round up
    ("  8Gi\t", 8 << 30), ("18446744073709551615", 2**64 - 1), ("15Ei", 15 << 60),
]
NOT_SIZES = ["", " ", "G", "Gi", ".", "-1G", "+1G", "8X", "1K", "1KB", "8g", "2t", "8 Gi", "1e9", "1E3",
             "1_000", "inf", "nan", "8Gi8", "1.2.3", "１２", "²", "1.0000000000000000001"]


@pytest.mark.parametrize("text,value", SIZES)
def test_sizes_are_kubernetes_quantities(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", NOT_SIZES)
def test_not_sizes_are_one_line(text):
    with pytest.raises(BadInput) as caught:
        parse_size(text, "--mem-limit")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("--mem-limit: ")


def test_milli_is_refused_with_the_spelling_meant():
    # Docker's --memory 512m means MiB; a quantity's m is milli: refused, never guessed
    with pytest.raises(BadInput, match="m is milli.*Mi"):
        parse_size("512m")


def test_limits_of_a_size():
    with pytest.raises(BadInput, match="too large"):
        parse_size("16Ei")
    with pytest.raises(BadInput, match="too large"):
        parse_size("18446744073709551616")
    with pytest.raises(BadInput, match="more than 0"):
        parse_size("0", minimum=1)
    assert parse_size("0") == 0
    with pytest.raises(BadInput, match="below 1Mi"):
        parse_size("1000k", "spec.quota.memory", minimum=1 << 20)


@pytest.mark.parametrize("value,text", [(8 << 30, "8Gi"), (1536 << 20, "1536Mi"), (10**9, "1000000000"), (0, "0")])
def test_format_size_reads_back(value, text):
    assert format_size(value) == text and parse_size(text) == value


DURATIONS = [("10ms", 0.01), ("2s", 2.0), ("1m", 60.0), ("1h", 3600.0), ("1m30s", 90.0), ("1h30m", 5400.0),
             ("1.5h", 5400.0), ("500us", 0.0005), ("1d", 86400.0), ("90", 90.0), ("0.5", 0.5), (" 2s ", 2.0),
             (4, 4.0), (0.25, 0.25)]
NOT_DURATIONS = ["", "s", "2x", "-1s", "0s", "0", "1 2s", "1m30", "2S", "1e3", "inf", "nan", "1_000",
                 "2 s", float("inf"), float("nan"), True]


@pytest.mark.parametrize("text,seconds", DURATIONS)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", NOT_DURATIONS)
def test_not_durations_are_one_line(text):
    with pytest.raises(BadInput) as caught:
        parse_duration(text, "--duration")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("--duration: ")


@pytest.mark.parametrize("seconds", [0.01, 0.5, 2.0, 90.0, 600.0, 5400.0, 7200.0, 90061.0, 2.5])
def test_format_duration_reads_back(seconds):
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


def test_every_reader_of_a_size_or_duration_takes_the_same_words():
    """run --mem-limit, a quota policy's memory, profile's --page-size and the agent's
    intervals: 1.5G is 10^9 * 1.5 and 8Gi is 8 GiB in each, and 1m30s is 90 s."""
    from seedance.profile.memory import parse_size as profile_size
    from seedance.profile.reports import parse_interval
    from seedance.quota.policy import parse_memory
    from seedance.run.limits import parse_mem_limit
    from seedance.service.config import parse_duration as agent_duration

    assert parse_mem_limit("1.5G,1:8Gi")[1] == {"default_bytes": 1_500_000_000, "per_device_bytes": {1: 8 << 30}}
    assert parse_memory("1.5G", "spec.quota.memory") == 1_500_000_000
    assert parse_memory("8Gi", "spec.quota.memory") == 8 << 30
    assert profile_size("2Mi", "--page-size") == 2 << 20 and profile_size("1.5G", "--capacity") == 1_500_000_000
    assert parse_interval("1m30s") == agent_duration("1m30s", "--gc-interval") == 90.0
    with pytest.raises(UsageError, match="30d"):
        agent_duration("31d", "--scan-interval")


@pytest.mark.parametrize("text", ["inf", "1e3", "nan", "1_000", "-1"])
def test_cpu_quantities_are_digits_only(text):
    from seedance.quota.policy import parse_cpu

    with pytest.raises(BadInput, match="not a CPU quantity"):
        parse_cpu(text, "spec.quota.cpu")


def test_mem_limit_device_is_ascii_digits():
    from seedance.run.limits import parse_mem_limit

    with pytest.raises(UsageError, match="the device must be"):
        parse_mem_limit("²:1Gi")
