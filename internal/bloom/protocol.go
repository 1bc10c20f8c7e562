package bloom

// The protocol between TestAndSet (Go) and its script (lua/*.lua): every
// argument slot, stride and reply code, named once here. The script
// declares the same numbers under the same names (with a lower-case
// prefix), and TestScriptProtocol holds the two together.
//
// KEYS are every key a call touches; everything below refers to a key by
// its 1-based index.
//
// ARGV:
//
//	argRing           the decision records' ring size R in bits: offset o's
//	                  decision is bit recordRingBit + o % R of its record
//	argRecordExpire   Unix time the decision records must live until
//	argPlans          msgpack: one array per plan the call reads (usually
//	                  one; two where a window and its neighbour were made
//	                  with different plans), planField* giving each entry
//	argBuckets        msgpack: one array per bucket the call reads: its
//	                  plan (1-based), its growth record's key (0: none),
//	                  then the first key of each of its plan's stages
//	                  (part i of a stage is that key's index plus i)
//	argGroups         msgpack, groupStride numbers per bucket group, in
//	                  ascending bucket order (groupField*)
//	argRuns           msgpack, runStride numbers per partition run, in
//	                  element order: its record's key, its element count
//	argElements       binary, elementBytes per element: its offset (7
//	                  bytes, big-endian) and its bucket group (2 bytes; 0:
//	                  not tested; probeGroup: a probe, only asked whether
//	                  it is below its record's delivered mark)
//	argLocations      where each element is, per plan: plan k's two slots
//	                  are argLocations + 2(k-1) and the one after.
//	                  Bloom: msgpack, per element, its words' masks and,
//	                  with stages, their positions in [0, 1)
//	                  (bloomLocationStride); then msgpack strings, per
//	                  element, its words' bit offsets in stage 0.
//	                  Fingerprint: binary, fpLocationBytes per element,
//	                  fpLoc* giving where each field starts: its position
//	                  in [0, 1) (a big-endian double), fpMaxBytes bytes of
//	                  fingerprint, and the first read of stage 0: the part
//	                  holding its home (2 bytes), its home's byte offset in
//	                  that part (4 bytes), and the byte range from its
//	                  home, fpFirstRead slots long, as decimal text (each a
//	                  length byte and up to fpTextBytes digits):
//	                  Redis formats a number passed to redis.call, which
//	                  costs more than the read. The second slot is empty.
//	                  An element not tested under a plan has zeros.
const (
	argRing = 1 + iota
	argRecordExpire
	argPlans
	argBuckets
	argGroups
	argRuns
	argElements
	argLocations
)

// The entries of a plan in argPlans (1-based, as Lua indexes them).
// Stage-indexed entries are arrays of one number per stage.
const (
	planFieldKind    = 1 + iota // kindCode*
	planFieldStages             // S
	planFieldCaps               // elements a stage takes on a shard; -1: no bound
	planFieldSizes              // a stage's words (Bloom) or slots (fingerprint) per shard
	planFieldPerPart            // a stage's words or slots per key
	planFieldLeads              // a stage's lead in milliseconds (StageLead)
	planFieldWidths             // Bloom: words per element (every stage); fingerprint: a stage's fingerprint bytes
)

// The kinds as argPlans writes them.
const (
	kindCodeBloom       = 1
	kindCodeFingerprint = 2
)

// A bucket group's entries in argGroups.
const (
	groupFieldRef      = 1 + iota // its bucket (1-based in argBuckets)
	groupFieldPrev                // the previous bucket's, 0: not tested
	groupFieldNext                // the next bucket's, 0: not tested
	groupFieldExpiry              // the Unix time its keys live until
	groupFieldDeadline            // the Unix time from which its oldest key may be gone
	groupStride        = iota
)

// The strides of the other arguments, and the group of a probe.
const (
	runStride    = 2
	elementBytes = 9
	probeGroup   = 1<<16 - 1
)

// A fingerprint location's fields: their offsets (0-based) and length.
const (
	fpTextBytes      = 10 // digits of a byte offset in a key (below 2^32)
	fpLocPosition    = 0
	fpLocFingerprint = fpLocPosition + 8
	fpLocPart        = fpLocFingerprint + fpMaxBytes
	fpLocHome        = fpLocPart + 2
	fpLocFrom        = fpLocHome + 4
	fpLocTo          = fpLocFrom + 1 + fpTextBytes
	fpLocationBytes  = fpLocTo + 1 + fpTextBytes
)

// recordRingBit is where a decision record's ring starts: bits 0 to 62
// hold its watermark (the highest offset decided + 1), the 63 bits from
// recordRingBit + R its floor (the lowest offset decided since it was
// made), the 63 bits from recordRingBit + R + 64 its delivered mark (every
// offset of the partition below it was delivered: Filter.Delivered).
const recordRingBit = 64

// deliveredBit is where a record of ring size r keeps its delivered mark.
func deliveredBit(r int64) int64 { return recordRingBit + r + 64 }

// The reply: one verdict code per element, in the order of the elements;
// then, when stages are due ahead, replyWanted and "bucket:stage" items
// (bucket 1-based in argBuckets), comma-separated. A refused call replies
// replyRefused and the items it needs, and wrote nothing.
const (
	codeNew           = 'N' // first seen, inserted
	codeDuplicate     = 'D' // held by a filter
	codeUntested      = 'U' // not tested: by the caller's choice, or past its deadline by the server's clock
	codeReplayedNew   = 'n' // decided before: forwarded
	codeReplayedDup   = 'd' // decided before: dropped
	codeReplayUnknown = 'u' // older than the record's horizon or floor
	codeDelivered     = 'k' // below the record's delivered mark (an element or a probe)
	codeProbeDecided  = 'y' // a probe above it and below the watermark
	codeProbeNew      = 'x' // a probe at or above the watermark
	replyRefused      = '!'
	replyWanted       = '+'
)
