"""A forged VXLAN packet and a UDP listener that logs what reaches it: the scripts the firewall
tests run (with the test machine's Python in a network namespace, or a lab host's python3).

VXLAN_SEND argv: outer source, outer destination, the destination VTEP's MAC, inner source, inner
destination, inner UDP port, token. It sends, three times over a raw socket, an IPv4/UDP packet to
port 8472 (flannel's) whose VXLAN header carries VNI 1 (flannel's) and an Ethernet frame to that
MAC holding an IPv4/UDP datagram with the token: VXLAN has no authentication, so whoever can put a
packet on the nodes' segment can make one, its outer source forged to a peer's address.

UDP_LOG argv: port, log file. Each datagram becomes a line "<source address> <payload>".
"""

from __future__ import annotations

VXLAN_SEND = r"""
import socket, struct, sys
outer_src, outer_dst, mac, inner_src, inner_dst, port, token = sys.argv[1:8]

def checksum(data):
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF

def ip_header(src, dst, proto, length):
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + length, 1, 0, 64, proto, 0,
                         socket.inet_aton(src), socket.inet_aton(dst))
    return header[:10] + struct.pack("!H", checksum(header)) + header[12:]

payload = token.encode()
inner_udp = struct.pack("!HHHH", 40000, int(port), 8 + len(payload), 0) + payload
inner = ip_header(inner_src, inner_dst, 17, len(inner_udp)) + inner_udp
frame = bytes.fromhex(mac.replace(":", "")) + bytes.fromhex("020000000001") + b"\x08\x00" + inner
vxlan = struct.pack("!II", 0x08000000, 1 << 8) + frame
outer_udp = struct.pack("!HHHH", 40001, 8472, 8 + len(vxlan), 0) + vxlan
packet = ip_header(outer_src, outer_dst, 17, len(outer_udp)) + outer_udp
sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for _ in range(3):
    sock.sendto(packet, (outer_dst, 0))
"""

UDP_LOG = r"""
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("0.0.0.0", int(sys.argv[1])))
with open(sys.argv[2], "a", buffering=1) as log:
    while True:
        data, (source, _) = sock.recvfrom(4096)
        log.write(f"{source} {data.decode(errors='replace')}\n")
"""
