// Package partitions reads the OpenSM partitions.conf that ipoibfs's software subnet
// manager uses to program port P_Key tables and to create IPoIB broadcast and other
// multicast groups.
//
// The grammar and semantics follow OpenSM (doc/partition-config.txt and
// opensm/osm_prtn_config.c, osm_prtn.c of linux-rdma/opensm). Where OpenSM only logs
// "PARSE WARN ... skipped/ignored" and carries on with a silently different
// configuration, [Parse] rejects the file instead, with a one-line "file:line: reason"
// [*Error]; the caller keeps its previous configuration.
//
// # Grammar
//
//	file        = { definition ":" properties ";" }
//	definition  = [Name] ["=" PKey] { "," flag }          (must be on one line)
//	flag        = "ipoib" | "indx0" | "defmember=" membership | groupflag
//	groupflag   = "rate=" n | "mtu=" n | "sl=" n | "scope=" n | "Q_Key=" n
//	            | "TClass=" n | "FlowLabel=" n
//	properties  = { port | mgidline } separated by "," and/or line breaks
//	port        = (GUID | "ALL" | "ALL_CAS" | "ALL_SWITCHES" | "ALL_ROUTERS" | "SELF" | "NONE")
//	              ["=" membership]
//	mgidline    = "mgid=" GID { "," groupflag }            (consumes the rest of its line)
//	membership  = "full" | "limited" | "both"
//
// '#' starts a comment anywhere; white space is allowed around '=', ',', ':' and ';';
// a definition may continue over several lines after its ':' and several definitions may
// share a line. Numbers are read like C strtoul(…, 0): 0x/0X hexadecimal, a leading 0
// octal, otherwise decimal, and must be consumed entirely.
//
// As in OpenSM, keywords, flag names and membership words may be abbreviated to any
// non-empty prefix and are matched case-sensitively in OpenSM's order: flags mtu, rate,
// scope, Q_Key, TClass, sl, FlowLabel, ipoib, indx0, defmember (so "s" is scope and
// "m=5" is mtu=5); ports NONE, ALL, ALL_CAS, ALL_SWITCHES, ALL_ROUTERS, SELF ("ALL_" is
// ALL_CAS); membership full, both, limited (the OpenSM documentation itself writes
// "=limi"). NONE entries and empty entries (", ,") are ignored. A definition name that
// starts with a digit and has no "=PKey" is the P_Key ("0x10 : ALL;").
//
// Group flag values are IBTA enumerations (see ib_types.h): mtu 1..5, rate a valid rate
// code 2..24 ([verbs.Rate.Valid]), sl 0..15, scope 1..15 (OpenSM skips 0), Q_Key 32
// bits, TClass 8 bits, FlowLabel 20 bits. Defaults are OpenSM's: rate 3 (10 Gb/s), mtu 4
// (2048), sl 0, scope 2 (link-local), Q_Key 0x0b1b for IPoIB/IP groups (and when Q_Key=0
// is given for them), 0 otherwise, TClass 0, FlowLabel 0. Giving scope= several times
// yields several groups; scope overwrites the MGID's scope nibble.
//
// # What OpenSM does, and what this package does
//
// P_Keys. Only the low 15 bits of a given P_Key are used, so 0xffff and 0x7fff both name
// the default partition; the membership bit comes from the member list. A key whose low
// 15 bits are zero (0x0000, 0x8000) is rejected (OpenSM would silently auto-assign one)
// and values above 0xffff are rejected (OpenSM truncates them).
//
// Default partition. OpenSM creates partition 0x7fff, named "Default", before it reads
// the file: with a file, every port starts as a limited member and the SM port as a full
// member; file rules for 0x7fff then change individual ports. So a file without a rule
// for it behaves as "Default=0x7fff : ALL=limited, SELF=full ;", and without any file
// OpenSM behaves as [Default] ("Default=0x7fff, ipoib : ALL=full ;"). [Config.PKeys]
// applies these rules; [Parse] does not add a partition for them. The SM port is always
// a full member of 0x7fff (a rule making it limited is overridden, as the OpenSM
// documentation promises). The partition with key 0x7fff is always named "Default", and
// an automatic-key definition named "Default" refers to it.
//
// Automatic keys. A definition without a P_Key is looked up by name first (OpenSM's
// osm_prtn_find_by_name): if a partition of that name exists, the definition adds to it.
// Otherwise the key comes from OpenSM's generate_pkey: a counter that starts at 0 for
// every load and is incremented until it hits a key not yet used by the default
// partition or by any partition defined earlier in the file (0x0001, 0x0002, … up to
// 0x7ffe). [Config.Keys] recomputes this. OpenSM's table also keeps partitions of the
// previous load, so a re-sweeping OpenSM may pick different keys; this package always
// computes them as a freshly started OpenSM does.
//
// Repeated definitions. Definitions with the same P_Key are merged into one [Partition]
// at the position of the first one, keeping the first name (OpenSM's "Duplicated
// partition definition ... Will use it"); members and mgid lines are appended in file
// order, indx0 set by any of them counts, DefMember and the partition-level flags of the
// first one are kept (they only matter while parsing their own definition). The IPoIB
// broadcast group is the one of the first definition that says ipoib; a later "ipoib"
// definition with different group flags is an error (OpenSM would silently keep the
// first). The following situations, which OpenSM resolves silently into something the
// user most likely did not mean, are errors: a name given two different keys; an
// explicit key equal to a key already auto-assigned to an earlier definition (OpenSM
// would merge the two unrelated partitions); the name "Default" with a key other than
// 0x7fff.
//
// Members. A port's membership is decided by the last member entry of the partition
// that matches it (OpenSM's osm_prtn_add_port overwrites), in file order across merged
// definitions. A member without "=…" gets the definition's defmember (default limited).
// "both" gives the port a full and a limited P_Key entry (OpenSM does that when
// allow_both_pkeys is set; without it OpenSM gives only the full entry). Member entries
// that are not known ports simply match nothing.
//
// mgid lines. The group inherits the definition's rate, mtu, sl, scope(s), Q_Key and
// FlowLabel, but not TClass (OpenSM's mgroup_create does not copy it), and the flags on
// the mgid line override them (scope adds to the inherited scopes). IP groups (MGID
// signature 0x401b or 0x601b) must have the definition's rate and mtu, and their P_Key
// field must be 0x0000 (filled in), the partition key, or the exact template
// ff12:401b:ffff::ffff:ffff; the stored MGID carries the partition key with the full
// bit, and Q_Key 0 becomes 0x0b1b. OpenSM only accepts the key without the full bit in
// the MGID; this package also accepts it with the bit so that [Config.String] output
// parses back. Repeated MGIDs (also the broadcast group's, as in the RHEL example file)
// are kept: like OpenSM, the SM creates the broadcast groups first, then the mgid groups
// in order, and skips an MGID that already exists. The scope nibble of a stored MGID is
// as written; the SM replaces it with each of Flags.Scopes.
//
// SL. OpenSM replaces a non-zero partition SL by 0 unless QoS is enabled; this package
// keeps the configured value.
//
// # Limits
//
// A hostile file cannot make Parse allocate without bound: input is capped at
// [MaxFileBytes] bytes, [MaxLines] lines of at most [MaxLineBytes] bytes (OpenSM's line
// buffer), [MaxPartitions] partitions, [MaxMembers] members, [MaxMGIDs] mgid lines and
// partition names of [MaxNameBytes] bytes. The caps are chosen so that [Config.String]
// of any accepted configuration fits them again. Control characters other than tab and
// carriage return are rejected outside comments.
//
// [Config.String] writes a file in canonical form (full flag and keyword names, explicit
// membership on every member, all flags on every mgid line) that parses back to an equal
// configuration apart from line numbers.
package partitions
