"""Several sequential readers of one file told apart (io.read_streams)."""

from ctdsfs.io.read_streams import STREAMS, ReadStreams


def test_each_reader_carries_on_with_what_was_asked_for_it():
    streams = ReadStreams()
    assert streams.follow(0, 0) is None and streams.follow(50, 50) is None  # (new readers)
    assert streams.follow(1, 1) == 2  # next to the first's last piece: it carries on
    streams.asked(1, 9)
    assert streams.follow(51, 52) == 53  # the second, which nothing was asked for yet
    streams.asked(52, 60)
    assert streams.follow(2, 2) == 10  # the first: past what was asked for it already
    assert streams.follow(52, 53) == 61  # (a read starting in the last one's piece)
    assert streams.follow(30, 30) is None  # a jump: a reader of its own from there
    assert streams.followed() == 3


def test_the_least_recent_reader_is_forgotten():
    streams = ReadStreams()
    for reader in range(STREAMS + 1):
        streams.follow(100 * reader, 100 * reader)
    assert streams.followed() == STREAMS
    assert streams.follow(1, 1) is None  # the first reader was forgotten
    assert streams.follow(100 * STREAMS + 1, 100 * STREAMS + 1) is not None
