import pytest

from paraplan import units


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80 GB", 80e9), ("80 GiB", 80 * 2**30), ("80GiB", 80 * 2**30), (1024, 1024.0), ("1.5 TB", 1.5e12), ("8 Gb", 1e9)],
)
def test_sizes_use_decimal_gb_and_binary_gib(text, expected):
    assert units.parse_bytes(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("900 GB/s", 9e11), ("200 Gb/s", 25e9), ("400 Gbps", 50e9), ("2 TB/s", 2e12)],
)
def test_bandwidths_accept_bytes_and_bits_per_second(text, expected):
    assert units.parse_bandwidth(text) == pytest.approx(expected)


def test_flop_rates_and_durations_and_money_parse():
    assert units.parse_flops("989 TFLOPS") == pytest.approx(989e12)
    assert units.parse_flops("19.5 TFLOP/s") == pytest.approx(19.5e12)
    assert units.parse_seconds("5 us") == pytest.approx(5e-6)
    assert units.parse_seconds("14d") == pytest.approx(14 * 86400)
    assert units.parse_usd("2.5 USD") == pytest.approx(2.5)
    assert units.parse_usd("$1.2") == pytest.approx(1.2)
    assert units.parse_usd("500000USD") == pytest.approx(5e5)
    assert units.parse_count("300e9") == pytest.approx(3e11)
    assert units.parse_count("2T") == pytest.approx(2e12)


@pytest.mark.parametrize("bad", ["eighty GB", "80 XB", "80 GB/h", True, None])
def test_unreadable_quantities_raise_a_unit_error_that_quotes_the_input(bad):
    with pytest.raises(units.UnitError):
        units.parse_bytes(bad) if bad != "80 GB/h" else units.parse_bandwidth(bad)


def test_a_small_models_parameters_and_rate_are_not_printed_as_zero():
    from paraplan.units import format_count, format_rate

    assert format_count(3.41e6) == "3.41 M"
    assert format_count(8.03e9) == "8.03 B"
    assert format_count(512) == "512"
    assert format_rate(0.0107) == "0.0107"
    assert format_rate(409.84) == "409.8"
    assert format_rate(0.0) == "0.0"


@pytest.mark.parametrize(("tokens", "written"), [(1e12, "1T"), (3e11, "300B"), (1.5e6, "1.5M"), (2000, "2K"), (7, "7")])
def test_a_token_count_is_written_as_a_job_file_takes_it(tokens, written):
    from paraplan.units import format_tokens, parse_count

    assert format_tokens(tokens) == written
    assert parse_count(written) == tokens
