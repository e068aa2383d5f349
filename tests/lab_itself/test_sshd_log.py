"""Reading sshd's log for handshakes in flight and for the connections a run opened
(lab/sshd_log.py), on lines as OpenSSH 9.2 writes them at LogLevel VERBOSE."""

from __future__ import annotations

from lab.sshd_log import connection_count, handshake_load, ssh_connections

LINES = """\
-- Journal begins --
1764750000.100000 h sshd[10]: Connection from 198.51.100.2 port 40001 on 198.51.100.9 port 22 rdomain ""
1764750000.110000 h sshd[11]: Connection from 198.51.100.3 port 40002 on 198.51.100.9 port 22 rdomain ""
1764750000.115000 h sshd[1]: drop connection #2 from [198.51.100.4]:40003 on [198.51.100.9]:22 past MaxStartups
1764750000.120000 h sshd[12]: Connection from 198.51.100.4 port 40004 on 198.51.100.9 port 22 rdomain ""
1764750000.150000 h sshd[10]: Accepted key ED25519 SHA256:x found at /root/.ssh/authorized_keys:1
1764750000.160000 h sshd[10]: Postponed publickey for root from 198.51.100.2 port 40001 ssh2 [preauth]
1764750000.200000 h sshd[10]: Accepted publickey for root from 198.51.100.2 port 40001 ssh2: ED25519 SHA256:x
1764750000.210000 h sshd[11]: Connection closed by 198.51.100.3 port 40002 [preauth]
1764750000.300000 h sshd[13]: Connection from 198.51.100.5 port 40005 on 198.51.100.9 port 22 rdomain ""
1764750000.400000 h sshd[12]: Accepted publickey for root from 198.51.100.4 port 40004 ssh2: ED25519 SHA256:x
1764750000.500000 h sshd[13]: Accepted publickey for root from 198.51.100.5 port 40005 ssh2: ED25519 SHA256:x
1764750000.600000 h sshd[10]: Disconnected from user root 198.51.100.2 port 40001
"""


def test_handshakes_in_flight_drops_and_logins_are_counted() -> None:
    load = handshake_load(LINES.splitlines())
    assert load.accepted == 4
    assert load.authenticated == 3
    assert load.dropped == 1
    assert load.most_in_flight == 3  # 40001, 40002 and 40004 at 0.12


# A run's connections at LogLevel VERBOSE: one authenticated and closed, one whose client port
# is used again later (a new connection), one ended before authenticating, one shed past
# MaxStartups, and the lab's own port probe from inside the host before the window.
RUN = """\
1764750100.000000 h sshd[20]: Connection from 127.0.0.1 port 50000 on 127.0.0.1 port 22 rdomain ""
1764750100.001000 h sshd[20]: Connection closed by 127.0.0.1 port 50000 [preauth]
1764750101.000000 h sshd[21]: Connection from 198.51.100.1 port 41000 on 198.51.100.9 port 22 rdomain ""
1764750101.050000 h sshd[21]: Accepted publickey for root from 198.51.100.1 port 41000 ssh2: ED25519 SHA256:x
1764750101.060000 h sshd[21]: pam_unix(sshd:session): session opened for user root(uid=0) by (uid=0)
1764750101.070000 h sshd[21]: Starting session: command for root from 198.51.100.1 port 41000 id 0
1764750102.000000 h sshd[21]: Received disconnect from 198.51.100.1 port 41000:11: disconnected by user
1764750102.000100 h sshd[21]: Disconnected from user root 198.51.100.1 port 41000
1764750103.000000 h sshd[22]: Connection from 198.51.100.1 port 41000 on 198.51.100.9 port 22 rdomain ""
1764750103.050000 h sshd[22]: Accepted publickey for root from 198.51.100.1 port 41000 ssh2: ED25519 SHA256:x
1764750103.100000 h sshd[23]: Connection from 198.51.100.1 port 41001 on 198.51.100.9 port 22 rdomain ""
1764750103.200000 h sshd[23]: Connection reset by 198.51.100.1 port 41001 [preauth]
1764750103.300000 h sshd[1]: drop connection #10 from [198.51.100.1]:41002 on [198.51.100.9]:22 past MaxStartups
1764750104.000000 h sshd[22]: Starting session: subsystem 'sftp' for root from 198.51.100.1 port 41000 id 0
"""


def test_every_connection_of_a_window_is_counted_once_with_how_it_ended() -> None:
    found = ssh_connections(RUN.splitlines(), since=1764750101.0)
    assert [(c.client, c.authenticated, c.dropped) for c in found] == [
        ("198.51.100.1:41000", True, False),
        ("198.51.100.1:41000", True, False),  # the same client port again: a second connection
        ("198.51.100.1:41001", False, False),
        ("198.51.100.1:41002", False, True),
    ]
    count = connection_count(RUN.splitlines(), since=1764750101.0)
    assert (count.opened, count.authenticated, count.dropped) == (4, 2, 1)


def test_the_window_is_by_the_time_a_connection_was_opened() -> None:
    everything = connection_count(RUN.splitlines())
    assert everything.opened == 5  # the port probe too
    # A connection opened before the window is not the window's, even if it authenticates in it.
    assert connection_count(RUN.splitlines(), since=1764750101.01).opened == 3
    assert connection_count(RUN.splitlines(), since=1764750101.0, until=1764750103.0).clients == ("198.51.100.1:41000",)


def test_a_login_is_counted_when_sshd_logs_only_at_info() -> None:
    info_only = [line for line in RUN.splitlines() if "Connection from " not in line]
    count = connection_count(info_only)
    assert (count.opened, count.authenticated) == (3, 2)  # two logins and one shed; unlogged set-ups are not seen
