#!lua
-- One atomic, replay-safe test-and-set of a batch of elements, in four
-- files run as one script: this prelude (the arguments and the state every
-- kind shares), bloom.lua and fingerprint.lua (each kind's test and
-- insert), testandset.lua (the call: records, decisions, growth, writes).
-- protocol.go names every argument slot, stride and reply code; the
-- numbers below are its, under the same names in lower-case prefixes
-- (TestScriptProtocol holds the two together).
--
-- Every read comes first, then the decision records are written, then the
-- filters. If a write fails, what was written is still replay-safe: either
-- nothing, or records whose filter entries are missing (a later copy may
-- pass). This script never makes a filter key: it only writes into keys
-- made whole, by SET NX, outside it; a call that needs a key not made is
-- refused before it writes anything.

local argRing, argRecordExpire, argPlans, argBuckets, argGroups, argRuns, argElements, argLocations = 1, 2, 3, 4, 5, 6, 7, 8
local planFieldKind, planFieldStages, planFieldCaps, planFieldSizes, planFieldPerPart, planFieldLeads, planFieldWidths = 1, 2, 3, 4, 5, 6, 7
local kindCodeBloom, kindCodeFingerprint = 1, 2
local groupFieldRef, groupFieldPrev, groupFieldNext, groupFieldExpiry, groupFieldDeadline, groupStride = 1, 2, 3, 4, 5, 5
local runStride, elementBytes, probeGroup = 2, 9, 65535
local fpLocationBytes, fpLocPosition, fpLocFingerprint, fpLocPart, fpLocHome, fpLocFrom, fpLocTo = 44, 0, 8, 16, 18, 22, 33
local recordRingBit = 64
-- Where a record's delivered mark starts: after its ring and its floor.
local recordDeliveredBit = recordRingBit + tonumber(ARGV[argRing]) + 64

-- Globals used per element, as locals: a global is a table lookup.
local band, bor, fmt, unpackStruct, sub, find = bit.band, bit.bor, string.format, struct.unpack, string.sub, string.find
local floor, mmin, call, KEYS = math.floor, math.min, redis.call, KEYS

local R = tonumber(ARGV[argRing])
local recordExpire = ARGV[argRecordExpire]
local runs = cmsgpack.unpack(ARGV[argRuns])
local groupTab = cmsgpack.unpack(ARGV[argGroups])
local bucketTab = cmsgpack.unpack(ARGV[argBuckets])
local E = ARGV[argElements]
local nEl = #E / elementBytes

-- plans[k]: the kind, the stages S and, per stage 0..S-1, cap (elements a
-- shard's stage takes), size (words or slots per shard), per (words or
-- slots per key), parts, lead (ms), width (Bloom: words per element;
-- fingerprint: bytes); and where the elements are under it (loc, offs).
local plans = {}
for k, p in ipairs(cmsgpack.unpack(ARGV[argPlans])) do
	local P = { kind = p[planFieldKind], S = p[planFieldStages], cap = {}, size = {}, per = {}, parts = {}, lead = {}, width = {} }
	for st = 0, P.S - 1 do
		local c = p[planFieldCaps][st + 1]
		P.cap[st] = c < 0 and math.huge or c
		P.size[st] = p[planFieldSizes][st + 1]
		P.per[st] = p[planFieldPerPart][st + 1]
		P.parts[st] = P.per[st] > 0 and P.size[st] / P.per[st] or 1
		P.lead[st] = p[planFieldLeads][st + 1]
		P.width[st] = p[planFieldWidths][st + 1]
	end
	local a, b = ARGV[argLocations + 2 * (k - 1)], ARGV[argLocations + 2 * (k - 1) + 1]
	if P.kind == kindCodeBloom then
		P.W = P.width[0]
		P.stride = P.S > 1 and 2 * P.W or P.W
		P.loc = cmsgpack.unpack(a) -- masks, then positions, per element
		P.offs = cmsgpack.unpack(b) -- stage 0 bit offsets, per element
	else
		P.loc = a -- binary, fpLocationBytes per element
	end
	plans[k] = P
end

-- A bucket: its plan, its growth record's key (0: none), and the first
-- key of each stage. ref numbers the buckets from 1.
local function planOf(ref) return plans[bucketTab[ref][1]] end
local function growthRecordOf(ref) return bucketTab[ref][2] end
local function stageKey(ref, st) return bucketTab[ref][3 + st] end

-- group returns the entries of bucket group g, in order: ref, prev, next,
-- expiry, deadline (groupField*).
local function group(g)
	return unpack(groupTab, groupStride * (g - 1) + 1, groupStride * g)
end
local nb = #groupTab / groupStride

-- The elements' offsets and groups.
local offOf, groupOf = {}, {}
for x = 1, nEl do
	offOf[x], groupOf[x] = unpackStruct('>I7I2', E, (x - 1) * elementBytes + 1)
end

local CHUNK = 64 -- sub-operations per BITFIELD call (unpack limit)

-- bitfield runs args[1..n] as sub-operations of per strings each on key, in
-- calls small enough to unpack, and returns all replies in order. Lengths
-- are counted, not taken with #, which costs a search per use.
local function bitfield(key, args, n, per)
	local out, m = {}, 0
	local step = CHUNK * per
	for i = 1, n, step do
		local r = call('BITFIELD', key, unpack(args, i, mmin(i + step - 1, n)))
		local c = #r
		for k = 1, c do out[m + k] = r[k] end
		m = m + c
	end
	return out
end

-- ARGS is one argument buffer for every BITFIELD call: a fresh table per
-- call would be grown, and collected, again each time.
local ARGS = {}

-- made reports whether every part of stage st of bucket ref exists; once
-- per stage and call.
local exists = {} -- first key index of a stage -> whether it is made
local function made(ref, st)
	local base = stageKey(ref, st)
	local e = exists[base]
	if e == nil then
		local np = planOf(ref).parts[st]
		local ks = {}
		for pt = 1, np do ks[pt] = KEYS[base + pt - 1] end
		e = call('EXISTS', unpack(ks)) == np
		exists[base] = e
	end
	return e
end

-- Buckets' growth records, read once per call: ref -> the fields below.
-- k, the stage inserts go to (0 when absent); n, the elements inserted
-- into it; c, new elements not inserted because the last stage was full
-- (test-only, the price of the cap); o, elements inserted past a stage's
-- capacity (only replicas of older versions add to it); a, the elements
-- inserted into all stages; t and s, the server time (ms) and a at the
-- last rate sample; r, the elements inserted per second between the last
-- two samples; w, the stage asked for ahead; x, the highest stage seen
-- made.
local grown = {}
local FIELDS = { 'k', 'n', 'o', 'c', 'a', 't', 's', 'r', 'w', 'x' }
local function growth(ref)
	local gs = grown[ref]
	if gs then return gs end
	gs = { dirty = false }
	local meta = growthRecordOf(ref)
	local r = meta > 0 and call('HMGET', KEYS[meta], unpack(FIELDS)) or {}
	for i = 1, #FIELDS do gs[FIELDS[i]] = tonumber(r[i]) or 0 end
	grown[ref] = gs
	return gs
end

local function expireNotBefore(key, at)
	if call('EXPIREAT', key, at, 'NX') == 0 then
		call('EXPIREAT', key, at, 'GT')
	end
end

-- written: key index -> the expiry of a key this call writes.
local written = {}

-- What the call decides: a verdict per element; the stages it needs and is
-- refused for, and those due ahead, as "ref:stage".
local verdict = {}
local needs, wants = {}, {}

-- admit finds where a new element of bucket ref (growth gs, plan P) goes:
-- 'insert' into stage gs.k, handing over to the next stage first when
-- gs.k is at its capacity and the next is made; 'testonly' past the last
-- stage; 'refuse' when the stage it needs is not made (noted in needs).
-- A stage handed over to in this call held nothing before it.
local function admit(ref, gs, P)
	if gs.n >= P.cap[gs.k] and gs.k + 1 < P.S then
		if made(ref, gs.k + 1) then
			gs.k, gs.n, gs.dirty = gs.k + 1, 0, true
			gs.x = math.max(gs.x, gs.k)
		else
			needs[#needs + 1] = ref .. ':' .. (gs.k + 1)
			return 'refuse'
		end
	end
	if gs.n >= P.cap[gs.k] then
		gs.c, gs.dirty = gs.c + 1, true
		return 'testonly'
	end
	if gs.madeK ~= gs.k then
		if not made(ref, gs.k) then
			needs[#needs + 1] = ref .. ':' .. gs.k
			return 'refuse'
		end
		gs.madeK = gs.k -- checked once per stage and call
	end
	gs.n, gs.a, gs.dirty = gs.n + 1, gs.a + 1, true
	return 'insert'
end
