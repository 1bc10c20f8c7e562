#!lua
-- One atomic, replay-safe test-and-set of a batch of elements.
--
-- KEYS: decision-record keys (one per shard and source partition) and
-- window filter keys (one per shard and bucket), addressed by index below.
-- ARGV[1] ring size R in bits; offset o's decision is bit 64 + o % R of its
--         record, bits 0..62 hold the watermark (highest offset + 1), and
--         the 63 bits from 64 + R the floor: the lowest offset decided since
--         the record was made. An offset below it was decided, if ever,
--         under a record that was lost (a restart without persistence, a
--         flush): its bit says nothing, so a replay of it is 'u'.
-- ARGV[2] Unix time the decision records must live until, at the least.
-- ARGV[3] msgpack [recordKeyIndex, count, ...]: the partition groups, in
--         element order; offsets ascend inside a group.
-- ARGV[4] msgpack numbers, per element: offset, bucket group (0: not to be
--         filtered), then each word's 52-bit mask, then (with stages) each
--         word's position in [0, 1), which places it in stages 1 and up.
-- ARGV[5] msgpack strings: per filtered element, the bit offset of each word.
-- ARGV[6] words per element.
-- ARGV[7] msgpack per bucket group, in ascending bucket order: its bucket
--         (index into ARGV[9]), the previous bucket's (0: none), the next
--         bucket's (0: none), expiry (Unix time), deadline (Unix time:
--         from then on the oldest key its elements are tested against may
--         be gone).
-- ARGV[8] msgpack stage table: S, each stage's capacity per shard, then
--         the words per shard of stages 1..S-1, then the lead of stages
--         1..S-1 in milliseconds (see the early trigger below), then the
--         words per key of stages 1..S-1: a stage of more words than one
--         key holds is in several keys (parts), word w in part
--         floor(w / words per key).
-- ARGV[9] msgpack per bucket: the index of its growth record (0 when S is
--         1), then the key index of each of its S stages (of its first
--         part; part i is that index plus i).
--
-- A bucket's growth record is a hash: k, the stage inserts go to (0 when
-- absent); n, the elements inserted into it; c, new elements not
-- inserted because the last stage was full (test-only, the price of the
-- cap); o, elements inserted past a stage's capacity (this script refuses
-- the call instead: only a replica of an older version adds to it);
-- a, the elements inserted into all stages; t and s, the server time (ms)
-- and a at the last rate sample; r, the elements inserted per second
-- between the last two samples; w, the stage asked for ahead; x, the
-- highest stage seen made.
--
-- A stage is made ahead of need: once the room left in the newest stage
-- is at most what the rate r inserts in the next stage's lead (the time
-- making it may take), the call asks for the next stage. A new element
-- that needs a stage not made yet (the next one, or the stage its bucket
-- inserts into, stage 0 of a window no one made) is not decided: the
-- whole call is refused, and nothing is written. This script never makes
-- a filter key: it only writes words of keys made whole, by SET NX,
-- outside it.
--
-- Returns, when the call is refused, '!' and the stages it needs as
-- "bucket:stage" (bucket an index into ARGV[9]), comma-separated.
-- Otherwise one character per element: N new, D duplicate, U new and not
-- filtered (the caller's choice, or its bucket group past its deadline by
-- this server's clock), n/d a replay decided new/duplicate before, u a
-- replay older than the record; then, when stages are due ahead, '+' and
-- those stages as above.
--
-- Every read comes first, then the decision records are written, then the
-- filters. If a write fails, what was written is still replay-safe: either
-- nothing, or records whose filter bits are missing (a later copy may pass).

local R = tonumber(ARGV[1])
local recordExpire = ARGV[2]
local parts = cmsgpack.unpack(ARGV[3])
local el = cmsgpack.unpack(ARGV[4])
local wordOffs = cmsgpack.unpack(ARGV[5])
local W = tonumber(ARGV[6])
local groupTab = cmsgpack.unpack(ARGV[7])
local stageTab = cmsgpack.unpack(ARGV[8])
local bucketTab = cmsgpack.unpack(ARGV[9])
local S = stageTab[1]
local capOf, nwOf, leadOf, perOf, partsOf = {}, {}, {}, {}, {}
for i = 0, S - 1 do capOf[i] = stageTab[2 + i] end
if S == 1 then capOf[0] = math.huge end -- one filter, no growth: never full
partsOf[0] = 1
for i = 1, S - 1 do
	nwOf[i] = stageTab[1 + S + i]
	leadOf[i] = stageTab[2 * S + i]
	perOf[i] = stageTab[3 * S - 1 + i]
	partsOf[i] = nwOf[i] / perOf[i]
end
-- The fill rate is sampled at most this often (ms): often enough to see a
-- spike begin, seldom enough that a few batches do not make the sample.
local RATE_MS = 250
local PER_BUCKET = S + 1 -- entries per bucket in bucketTab

local band, bor, fmt = bit.band, bit.bor, string.format
local HALF = 67108864 -- 2^26
local CHUNK = 64    -- sub-operations per BITFIELD call (unpack limit)
local stride = 2 + W
if S > 1 then stride = 2 + 2 * W end
local nEl = #el / stride

local verdict = {}  -- element -> verdict character
local wordBase = {} -- filtered element -> index before its first word offset

-- bitfield runs args[1..n] as sub-operations of per strings each on key, in
-- calls small enough to unpack, and returns all replies in order. Lengths
-- are counted, not taken with #, which costs a search per use.
local function bitfield(key, args, n, per)
	local out, m = {}, 0
	local step = CHUNK * per
	for i = 1, n, step do
		local r = redis.call('BITFIELD', key, unpack(args, i, math.min(i + step - 1, n)))
		local c = #r
		for k = 1, c do out[m + k] = r[k] end
		m = m + c
	end
	return out
end

-- ARGS is one argument buffer for every BITFIELD call: a fresh table per
-- call would be grown, and collected, again each time.
local ARGS = {}

-- place is where word j of element x is in stage st, whose first key has
-- index base: the key's index and the word's bit offset in it. Stage 0's
-- offset comes with the call; later stages' from the word's position in
-- [0, 1), in the part that holds it.
local function place(base, x, st, j)
	if st == 0 then return base, wordOffs[wordBase[x] + j] end
	local w = math.floor(el[(x - 1) * stride + 2 + W + j] * nwOf[st])
	local per = perOf[st]
	local pt = math.floor(w / per)
	-- As a decimal string: Redis versions format Lua numbers of 1e9 and up
	-- differently, some in a form BITFIELD refuses.
	return base + pt, fmt('%d', (w - pt * per) * 52)
end

-- cached is this call's value of a word (nil when it did not write it).
local caches = {} -- filter key index -> { word offset -> new value }
local function cached(k, off)
	local c = caches[k]
	return c and c[off]
end

-- getWords reads words j1..j2 in stage st (first key base) of the n
-- elements xs[1..n], in that order: one BITFIELD per key it touches.
local function getWords(base, st, xs, n, j1, j2)
	if partsOf[st] == 1 then
		local args, m = ARGS, 0
		for i = 1, n do
			local x = xs[i]
			for j = j1, j2 do
				local _, off = place(base, x, st, j)
				args[m + 1] = 'GET'
				args[m + 2] = 'u52'
				args[m + 3] = off
				m = m + 3
			end
		end
		return bitfield(KEYS[base], args, m, 3)
	end
	local byKey, m = {}, 0 -- key index -> its GETs, and where each reply goes
	for i = 1, n do
		local x = xs[i]
		for j = j1, j2 do
			m = m + 1
			local k, off = place(base, x, st, j)
			local a = byKey[k]
			if a == nil then
				a = { n = 0, at = {} }
				byKey[k] = a
			end
			local c = a.n
			a[3 * c + 1], a[3 * c + 2], a[3 * c + 3] = 'GET', 'u52', off
			a.n, a.at[c + 1] = c + 1, m
		end
	end
	local out = {}
	for k, a in pairs(byKey) do
		local r = bitfield(KEYS[k], a, 3 * a.n, 3)
		for i = 1, a.n do out[a.at[i]] = r[i] end
	end
	return out
end

-- made reports whether every part of stage st (first key base) exists.
local function made(base, st)
	local np = partsOf[st]
	local ks = {}
	for pt = 1, np do ks[pt] = KEYS[base + pt - 1] end
	return redis.call('EXISTS', unpack(ks)) == np
end

-- growthRecordOf is the key index of a bucket's growth record (0 when S
-- is 1), stageKey the key index of its stage st; ref numbers the bucket
-- in bucketTab.
local function growthRecordOf(ref) return bucketTab[PER_BUCKET * (ref - 1) + 1] end
local function stageKey(ref, st) return bucketTab[PER_BUCKET * (ref - 1) + 2 + st] end

-- Buckets' growth records, read once per call: ref -> the fields above.
local grown = {}
local FIELDS = { 'k', 'n', 'o', 'c', 'a', 't', 's', 'r', 'w', 'x' }
local function growth(ref)
	local st = grown[ref]
	if st then return st end
	st = { dirty = false }
	local meta = growthRecordOf(ref)
	local r = meta > 0 and redis.call('HMGET', KEYS[meta], unpack(FIELDS)) or {}
	for i = 1, #FIELDS do st[FIELDS[i]] = tonumber(r[i]) or 0 end
	grown[ref] = st
	return st
end

-- holds reports whether word value v has every bit of mask mk, testing the
-- high and the low 26 bits with Lua's 32-bit bit library.
local function holds(v, mk)
	local l, ml = v % HALF, mk % HALF
	local mh = (mk - ml) / HALF
	return band((v - l) / HALF, mh) == mh and band(l, ml) == ml
end

local function expireNotBefore(key, at)
	if redis.call('EXPIREAT', key, at, 'NX') == 0 then
		redis.call('EXPIREAT', key, at, 'GT')
	end
end

local PER_GROUP = 5 -- entries per bucket group in groupTab
local nb = #groupTab / PER_GROUP
-- group returns the entries of bucket group g, in order: ref, its bucket
-- (an index into bucketTab); prevRef and nextRef, the previous and the
-- next bucket's (0: not tested); expiry, the Unix time its keys live
-- until; deadline, the Unix time from which the oldest key its elements
-- are tested against may be gone.
local function group(g)
	return unpack(groupTab, PER_GROUP * (g - 1) + 1, PER_GROUP * g)
end
local fresh, nfresh = {}, {}
for g = 1, nb do fresh[g], nfresh[g] = {}, 0 end

-- The caller judged lateness by its clock; keys expire by this server's.
-- A group whose deadline has come here is not filtered: its oldest key may
-- be gone, and testing against nothing would call every copy new.
local t = redis.call('TIME')
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local past = {}
for g = 1, nb do
	local _, _, _, _, deadline = group(g)
	past[g] = nowMs >= tonumber(deadline) * 1000
end

-- 1. Replays: an offset below a record's watermark was decided before.
local records, nrec = {}, 0
local e, wi = 1, 0
for p = 1, #parts, 2 do
	local key = KEYS[parts[p]]
	local last = e + parts[p + 1] - 1
	local head = redis.call('BITFIELD', key, 'GET', 'u63', '0', 'GET', 'u63', fmt('%d', 64 + R))
	local mark, floor = head[1], head[2]
	local reads, readEls, nr = {}, {}, 0
	for x = e, last do
		local base = (x - 1) * stride
		local off, g = el[base + 1], el[base + 2]
		if g > 0 then
			wordBase[x] = wi
			wi = wi + W
		end
		if off < mark then
			if off >= mark - R and off >= floor then
				nr = nr + 1
				reads[3 * nr - 2] = 'GET'
				reads[3 * nr - 1] = 'u1'
				reads[3 * nr] = fmt('%d', 64 + off % R)
				readEls[nr] = x
			else
				verdict[x] = 'u'
			end
		elseif g > 0 and not past[g] then
			local c = nfresh[g] + 1
			fresh[g][c] = x
			nfresh[g] = c
		else
			verdict[x] = 'U'
		end
	end
	if nr > 0 then
		local got = bitfield(key, reads, 3 * nr, 3)
		for i = 1, nr do
			verdict[readEls[i]] = got[i] == 1 and 'n' or 'd'
		end
	end
	nrec = nrec + 1
	records[nrec] = { key, mark, e, last }
	e = last + 1
end

-- 2. Filters, bucket by bucket in ascending order, so a bucket's new
-- elements are visible to the next bucket's test of its previous bucket.
-- A word holds a mask when band(high 26 bits) and band(low 26 bits) do.
-- Every stage a bucket has is tested; inserts go to its newest.
local touched = {} -- first key index of the stages this call writes
local wants, needs = {}, {} -- "ref:stage" due ahead; needed now (refused)
local dirtyOf = {} -- filter key index -> { n, offsets... }
local written = {} -- key index -> expiry, for the keys written
local exists = {} -- first key index of a stage -> whether it is made

-- inStage tests the candidates xs[1..n] against stage st (first key
-- keyIdx): the first word for all, the others only where the first holds,
-- with the writes of this call seen through the keys' caches. It sets
-- hit[x] and returns the candidates it did not hold.
local function inStage(keyIdx, st, xs, n, hit)
	local first = getWords(keyIdx, st, xs, n, 1, 1)
	local more, nm = {}, 0
	for i = 1, n do
		local x = xs[i]
		if holds(cached(place(keyIdx, x, st, 1)) or first[i], el[(x - 1) * stride + 3]) then
			nm = nm + 1
			more[nm] = x
		end
	end
	local rest = W > 1 and getWords(keyIdx, st, more, nm, 2, W) or {}
	for i = 1, nm do
		local x = more[i]
		local base, rb = (x - 1) * stride + 1, (i - 1) * (W - 1) - 1
		local all = true
		for j = 2, W do
			if not holds(cached(place(keyIdx, x, st, j)) or rest[rb + j], el[base + 1 + j]) then
				all = false
				break
			end
		end
		if all then hit[x] = true end
	end
	local left, nl = {}, 0
	for i = 1, n do
		if not hit[xs[i]] then
			nl = nl + 1
			left[nl] = xs[i]
		end
	end
	return left, nl
end

for g = 1, nb do
	local xs, n = fresh[g], nfresh[g]
	if n > 0 then
		local ref, prevRef, nextRef, expiry = group(g)
		local gs = growth(ref)

		-- The newest stage is read whole, as the words inserts will change;
		-- the older ones, full, are tested like the neighbours.
		local k0 = gs.k
		local vals = getWords(stageKey(ref, k0), k0, xs, n, 1, W)
		local hit = {}
		local cand, nc = {}, 0
		-- With one stage and no neighbour (a fixed window that has not
		-- grown), the decision below tests the stage read, as it must
		-- anyway for the writes of this call: no test ahead of it.
		local pretest = k0 > 0 or prevRef + nextRef > 0
		for k = 1, pretest and n or 0 do
			local x = xs[k]
			local base, vb = (x - 1) * stride + 1, (k - 1) * W
			local all = true
			for j = 1, W do
				if not holds(vals[vb + j], el[base + 1 + j]) then
					all = false
					break
				end
			end
			if all then
				hit[x] = true
			else
				nc = nc + 1
				cand[nc] = x
			end
		end
		for st = k0 - 1, 0, -1 do
			if nc == 0 then break end
			cand, nc = inStage(stageKey(ref, st), st, cand, nc, hit)
		end
		-- The rest are tested against every stage of the neighbours given
		-- (the previous bucket; the next one when the input is read late,
		-- so that copies decided out of event-time order still meet).
		for _, other in ipairs({ prevRef, nextRef }) do
			if other > 0 and nc > 0 then
				local otherGrowth = growth(other)
				for st = otherGrowth.k, 0, -1 do
					if nc == 0 then break end
					cand, nc = inStage(stageKey(other, st), st, cand, nc, hit)
				end
			end
		end

		-- Decide in order: an element held by none is new, and inserted in
		-- the newest stage, whose cache makes it visible to later elements
		-- of the call. A stage at its capacity hands over to the next,
		-- made ahead; if that is missing the call is refused (the bucket
		-- stops here, the others go on only to name what they need), and
		-- past the last stage the bucket only tests (counted in c). A
		-- stage handed over to in this call held nothing before it.
		local refused = false
		local keyOf = {}
		for st = 0, S - 1 do keyOf[st] = stageKey(ref, st) end
		for k = 1, n do
			local x = xs[k]
			local base, vb = (x - 1) * stride + 1, (k - 1) * W
			local dup, wb = hit[x], wordBase[x]
			for st = k0, gs.k do
				if dup then break end
				-- Without writes in this call, stage k0 holds what vals
				-- held, tested above if pretest.
				if touched[keyOf[st]] or st ~= k0 or not pretest then
					local all = true
					local c0 = st == 0 and caches[keyOf[0]] -- stage 0: inline, the common case
					for j = 1, W do
						local v
						if st == 0 then
							v = c0 and c0[wordOffs[wb + j]]
						else
							v = cached(place(keyOf[st], x, st, j))
						end
						v = v or (st == k0 and vals[vb + j]) or 0
						if not holds(v, el[base + 1 + j]) then
							all = false
							break
						end
					end
					dup = all
				end
			end
			if dup then
				verdict[x] = 'D'
			else
				verdict[x] = 'N'
				if gs.n >= capOf[gs.k] and gs.k + 1 < S then
					local nk = keyOf[gs.k + 1]
					if exists[nk] == nil then exists[nk] = made(nk, gs.k + 1) end
					if exists[nk] then
						gs.k, gs.n, gs.dirty = gs.k + 1, 0, true
						gs.x = math.max(gs.x, gs.k)
					else
						refused = true
						needs[#needs + 1] = ref .. ':' .. (gs.k + 1)
						break
					end
				end
				-- Past the last stage the bucket only tests.
				-- The stage inserted into must be made (stage 0 of a window
				-- no one made, or one whose keys were lost, is not).
				local sk = keyOf[gs.k]
				if gs.n < capOf[gs.k] and exists[sk] == nil then exists[sk] = made(sk, gs.k) end
				if gs.n < capOf[gs.k] and not exists[sk] then
					refused = true
					needs[#needs + 1] = ref .. ':' .. gs.k
					break
				end
				if gs.n >= capOf[gs.k] then
					gs.c, gs.dirty = gs.c + 1, true
				else
					gs.n, gs.a, gs.dirty = gs.n + 1, gs.a + 1, true
					touched[keyOf[gs.k]] = true
					for j = 1, W do
						local keyIdx, off = keyOf[0], wordOffs[wb + j]
						if gs.k > 0 then keyIdx, off = place(keyOf[gs.k], x, gs.k, j) end
						local c = caches[keyIdx]
						if c == nil then
							c = {}
							caches[keyIdx] = c
							dirtyOf[keyIdx] = { 0 }
							written[keyIdx] = expiry
						end
						local v = c[off]
						if v == nil then
							v = (gs.k == k0 and vals[vb + j]) or 0
							local d = dirtyOf[keyIdx]
							d[1] = d[1] + 1
							d[d[1] + 1] = off
						end
						local l = v % HALF
						local h = (v - l) / HALF
						local mk = el[base + 1 + j]
						local ml = mk % HALF
						local mh = (mk - ml) / HALF
						c[off] = bor(h, mh) * HALF + bor(l, ml)
					end
				end
			end
		end
		if not refused and gs.k + 1 < S then
			-- The rate: elements inserted since the last sample over the
			-- time since, sampled at most every RATE_MS.
			if gs.dirty then
				if gs.t == 0 or nowMs < gs.t then
					gs.t, gs.s = nowMs, gs.a
				elseif nowMs - gs.t >= RATE_MS then
					gs.r = (gs.a - gs.s) * 1000 / (nowMs - gs.t)
					gs.t, gs.s = nowMs, gs.a
				end
			end
			-- Ahead of need: ask for the next stage while the newest has
			-- room for no more than the rate fills in the next stage's
			-- lead (at once when it is full), until it is seen made.
			local nxt = gs.k + 1
			if gs.x < nxt and capOf[gs.k] - gs.n <= gs.r * leadOf[nxt] / 1000 then
				if made(keyOf[nxt], nxt) then
					gs.x, gs.dirty = nxt, true
				else
					wants[#wants + 1] = ref .. ':' .. nxt
					if gs.w < nxt then gs.w, gs.dirty = nxt, true end
				end
			end
		end
		if gs.dirty then written[growthRecordOf(ref)] = expiry end
	end
end

-- A stage needed and not made: nothing is written, the caller makes or
-- awaits it and calls again.
if #needs > 0 then return '!' .. table.concat(needs, ',') end

-- 3. Decision records: the fresh decisions of each partition, packed into
-- fields of up to 50 bits (offsets in between belong to other shards or were
-- never asked, and are never read here), then the new watermark.
local pow2 = {}
for i = 0, 50 do pow2[i] = 2 ^ i end
for r = 1, nrec do
	local key, mark, a, z = records[r][1], records[r][2], records[r][3], records[r][4]
	local args, m = ARGS, 0
	local start, last, val, first
	for x = a, z do
		local v = verdict[x]
		if v == 'N' or v == 'D' or v == 'U' then
			local off = el[(x - 1) * stride + 1]
			first = first or off
			local b = (v == 'D') and 0 or 1
			if start and off - start < 50 and start % R + (off - start) < R then
				val = val * pow2[off - last] + b
			else
				if start then
					args[m + 1], args[m + 2], args[m + 3], args[m + 4] =
						'SET', 'u' .. (last - start + 1), fmt('%d', 64 + start % R), fmt('%d', val)
					m = m + 4
				end
				start, val = off, b
			end
			last = off
		end
	end
	if start then
		args[m + 1], args[m + 2], args[m + 3], args[m + 4] =
			'SET', 'u' .. (last - start + 1), fmt('%d', 64 + start % R), fmt('%d', val)
		m = m + 4
		if last >= mark then
			args[m + 1], args[m + 2], args[m + 3], args[m + 4] = 'SET', 'u63', '0', fmt('%d', last + 1)
			m = m + 4
		end
		if mark == 0 and first > 0 then
			-- A record made now: older offsets were not decided under it.
			args[m + 1], args[m + 2], args[m + 3], args[m + 4] = 'SET', 'u63', fmt('%d', 64 + R), fmt('%d', first)
			m = m + 4
		end
		bitfield(key, args, m, 4)
		expireNotBefore(key, recordExpire)
	end
end

-- 4. Filter words, into keys made whole before (checked above), so no
-- write grows a key. Then the growth records.
for keyIdx, d in pairs(dirtyOf) do
	local c, nd = caches[keyIdx], d[1]
	if nd > 0 then
		local args, m = ARGS, 0
		for k = 1, nd do
			local off = d[k + 1]
			args[m + 1], args[m + 2], args[m + 3], args[m + 4] = 'SET', 'u52', off, fmt('%d', c[off])
			m = m + 4
		end
		bitfield(KEYS[keyIdx], args, m, 4)
		expireNotBefore(KEYS[keyIdx], written[keyIdx])
	end
end
for ref, gs in pairs(grown) do
	local meta = growthRecordOf(ref)
	if gs.dirty and meta > 0 then
		redis.call('HSET', KEYS[meta], 'k', fmt('%d', gs.k), 'n', fmt('%d', gs.n), 'o', fmt('%d', gs.o), 'c', fmt('%d', gs.c),
			'a', fmt('%d', gs.a), 't', fmt('%d', gs.t), 's', fmt('%d', gs.s), 'r', fmt('%.1f', gs.r), 'w', fmt('%d', gs.w), 'x', fmt('%d', gs.x))
		expireNotBefore(KEYS[meta], written[meta])
	end
end

local out = table.concat(verdict, '', 1, nEl)
if #wants > 0 then out = out .. '+' .. table.concat(wants, ',') end
return out
