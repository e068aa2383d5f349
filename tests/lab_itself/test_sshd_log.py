"""Reading sshd's log for handshakes in flight (lab/sshd_log.py), on lines as
OpenSSH 9.2 writes them at LogLevel VERBOSE."""

from __future__ import annotations

from lab.sshd_log import handshake_load

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
