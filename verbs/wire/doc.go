// Package wire encodes and decodes the packets of the emulated InfiniBand fabric.
//
// # Framing
//
// Every fabric packet travels as one UDP datagram. The datagram payload is a
// RoCEv2-shaped InfiniBand packet that starts with the Base Transport Header:
//
//	BTH (12) | extension headers (DETH 8, AETH 4, ImmDt 4) | payload | pad to 4 bytes | ICRC (4)
//
// The LRH/GRH of native InfiniBand (and the IP/UDP header of real RoCEv2) are not part
// of the datagram payload: the fabric learns source and destination GIDs from its own
// tables, and the UDP port defaults to [UDPPort] (4791), so captures of the emulated
// fabric decode as RoCEv2 in Wireshark.
//
// Supported opcodes are the RC SEND family (FIRST, MIDDLE, LAST, LAST with immediate,
// ONLY, ONLY with immediate), the RC ACKNOWLEDGE and the UD SEND_ONLY opcodes with and
// without immediate; see [Supported]. [Parse] rejects everything else with [ErrOpcode].
//
// # ICRC and the canonical pseudo header
//
// The real IP and UDP headers of an emulated packet are whatever the kernel's UDP socket
// uses (loopback addresses, ephemeral ports), and they are invisible to the receiver's
// fabric code anyway. The ICRC is therefore computed over a CANONICAL pseudo header
// instead, the one a RoCEv2-over-IPv6 sender with SGID/DGID as IPv6 addresses would use:
//
//	8 × 0xff                                   masked LRH
//	IPv6 header (40 bytes):
//	  0x6f 0xff 0xff 0xff                      version 6, traffic class and flow label masked to ones
//	  payload length (BE16) = 8 + len(IB packet including ICRC)
//	  next header 17, hop limit 0xff (masked)
//	  source address = SGID, destination address = DGID
//	UDP header (8 bytes):
//	  source port 0xC000, destination port 4791,
//	  length (BE16) = 8 + len(IB packet including ICRC), checksum 0xffff (masked)
//	BTH with byte 4 (FECN, BECN, 6 reserved bits) set to 0xff (masked)
//	the rest of the IB packet up to, excluding, the ICRC (extension headers, payload, pad)
//
// The ICRC is plain CRC-32/IEEE (the zlib/Ethernet CRC, reflected polynomial 0xEDB88320,
// initial value and final XOR 0xffffffff) over exactly that byte string, i.e.
// crc32.ChecksumIEEE(canonical). It is stored in the last 4 bytes of the packet in
// LITTLE-ENDIAN byte order. This is bit-for-bit what Linux rdma_rxe does on x86:
// rxe_icrc.c runs crc32_le (no pre/post inversion) from the seed 0xDEBB20E3, which is
// the register after 8 bytes of 0xff from the usual 0xffffffff start, over the masked
// pseudo header and the rest of the packet, then stores the complement as a host-order
// (little-endian) u32. As with the Ethernet FCS, CRC-32/IEEE over the canonical string
// followed by the stored ICRC bytes yields the standard residue 0x2144DF1C. Wireshark
// shows the field as "Invariant CRC" reading the 4 bytes big-endian, so it displays the
// byte-swapped value; it does not validate it.
//
// The receiver computes the ICRC with the SGID and DGID it expects. For multicast,
// where the destination GID is not carried in the datagram, [MatchICRC] tries a list of
// candidate MGIDs and returns the one that matches; it computes the CRC of the packet
// body once and combines it with each candidate's 68-byte header CRC using CRC
// linearity (zlib's crc32_combine), so extra candidates cost only a header each.
//
// Encoding and checking do not allocate. Captures for Wireshark/tshark can be written
// with [PcapWriter], which frames each packet as Ethernet/IPv6/UDP 4791 with the GIDs as
// IPv6 addresses (LINKTYPE_ETHERNET).
package wire
