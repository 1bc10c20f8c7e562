#!lua
-- One atomic, replay-safe test-and-set of a batch of elements.
--
-- KEYS: decision-record keys (one per shard and source partition) and
-- window filter keys (one per shard and bucket), addressed by index below.
-- ARGV[1] ring size R in bits; offset o's decision is bit 64 + o % R of its
--         record, and bits 0..62 hold the watermark: highest offset + 1.
-- ARGV[2] Unix time the decision records must live until, at the least.
-- ARGV[3] msgpack [recordKeyIndex, count, ...]: the partition groups, in
--         element order; offsets ascend inside a group.
-- ARGV[4] msgpack numbers, per element: offset, bucket group (0: not to be
--         filtered), then each word's 52-bit mask.
-- ARGV[5] msgpack strings: per filtered element, the bit offset of each word.
-- ARGV[6] words per element.
-- ARGV[7] msgpack per bucket group, in ascending bucket order: filter key
--         index, previous bucket's key index (0: none), next bucket's key
--         index (0: none), expiry (Unix time), bit offset of the key's last
--         byte, deadline (Unix time: from then on the oldest key its
--         elements are tested against may be gone).
-- Returns one character per element: N new, D duplicate, U new and not
-- filtered (the caller's choice, or its bucket group past its deadline by
-- this server's clock), n/d a replay decided new/duplicate before, u a
-- replay older than the record.
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
local buckets = cmsgpack.unpack(ARGV[7])

local band, bor, fmt = bit.band, bit.bor, string.format
local HALF = 67108864 -- 2^26
local CHUNK = 64    -- sub-operations per BITFIELD call (unpack limit)
local stride = 2 + W
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

-- getWords reads words j1..j2 of the n elements xs[1..n].
local function getWords(key, xs, n, j1, j2)
	local args, m = ARGS, 0
	for i = 1, n do
		local wb = wordBase[xs[i]]
		for j = j1, j2 do
			args[m + 1] = 'GET'
			args[m + 2] = 'u52'
			args[m + 3] = wordOffs[wb + j]
			m = m + 3
		end
	end
	return bitfield(key, args, m, 3)
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

local BG = 6 -- entries per bucket group
local nb = #buckets / BG
local fresh, nfresh = {}, {}
for g = 1, nb do fresh[g], nfresh[g] = {}, 0 end

-- The caller judged lateness by its clock; keys expire by this server's.
-- A group whose deadline has come here is not filtered: its oldest key may
-- be gone, and testing against nothing would call every copy new.
local t = redis.call('TIME')
local nowMs = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local past = {}
for g = 1, nb do past[g] = nowMs >= tonumber(buckets[BG * g]) * 1000 end

-- 1. Replays: an offset below a record's watermark was decided before.
local records, nrec = {}, 0
local e, wi = 1, 0
for p = 1, #parts, 2 do
	local key = KEYS[parts[p]]
	local last = e + parts[p + 1] - 1
	local mark = redis.call('BITFIELD', key, 'GET', 'u63', '0')[1]
	local reads, readEls, nr = {}, {}, 0
	for x = e, last do
		local base = (x - 1) * stride
		local off, g = el[base + 1], el[base + 2]
		if g > 0 then
			wordBase[x] = wi
			wi = wi + W
		end
		if off < mark then
			if off >= mark - R then
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
local caches = {} -- filter key index -> { word offset -> new value }
local writes, nwrites = {}, 0
for g = 1, nb do
	local xs, n = fresh[g], nfresh[g]
	if n > 0 then
		local keyIdx = buckets[BG * g - 5]
		local vals = getWords(KEYS[keyIdx], xs, n, 1, W)

		-- Elements not in their own bucket before this batch are tested
		-- against the neighbours given (the previous bucket; the next one
		-- when the input is read late, so that copies decided out of
		-- event-time order still meet): the first word for all, the other
		-- words only where the first holds.
		local inOther = {}
		local prevIdx, nextIdx = buckets[BG * g - 4], buckets[BG * g - 3]
		local cand, nc = {}, 0
		for k = 1, (prevIdx + nextIdx > 0) and n or 0 do
			local x = xs[k]
			local base, vb = (x - 1) * stride + 1, (k - 1) * W
			for j = 1, W do
				if not holds(vals[vb + j], el[base + 1 + j]) then
					nc = nc + 1
					cand[nc] = x
					break
				end
			end
		end
		for _, otherIdx in ipairs({ prevIdx, nextIdx }) do
			if otherIdx > 0 and nc > 0 then
				local oc = caches[otherIdx] or {}
				local first = getWords(KEYS[otherIdx], cand, nc, 1, 1)
				local more, nm = {}, 0
				for i = 1, nc do
					local x = cand[i]
					local base = (x - 1) * stride + 1
					if holds(oc[wordOffs[wordBase[x] + 1]] or first[i], el[base + 2]) then
						nm = nm + 1
						more[nm] = x
					end
				end
				local rest = W > 1 and getWords(KEYS[otherIdx], more, nm, 2, W) or {}
				for i = 1, nm do
					local x = more[i]
					local base, wb, rb = (x - 1) * stride + 1, wordBase[x], (i - 1) * (W - 1) - 1
					local all = true
					for j = 2, W do
						if not holds(oc[wordOffs[wb + j]] or rest[rb + j], el[base + 1 + j]) then
							all = false
							break
						end
					end
					inOther[x] = all or nil
				end
				-- The next neighbour tests only what this one did not hold.
				local left, nl = {}, 0
				for i = 1, nc do
					if not inOther[cand[i]] then
						nl = nl + 1
						left[nl] = cand[i]
					end
				end
				cand, nc = left, nl
			end
		end

		-- Decide in order; the cache makes earlier elements of the batch
		-- visible to later ones.
		local c, dirty, nd = {}, {}, 0
		caches[keyIdx] = c
		for k = 1, n do
			local x = xs[k]
			local base, wb, vb = (x - 1) * stride + 1, wordBase[x], (k - 1) * W
			local found = true
			for j = 1, W do
				if not holds(c[wordOffs[wb + j]] or vals[vb + j], el[base + 1 + j]) then
					found = false
					break
				end
			end
			if found or inOther[x] then
				verdict[x] = 'D'
			else
				verdict[x] = 'N'
				for j = 1, W do
					local off = wordOffs[wb + j]
					local v = c[off]
					if v == nil then
						v = vals[vb + j]
						nd = nd + 1
						dirty[nd] = off
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
		nwrites = nwrites + 1
		writes[nwrites] = { KEYS[keyIdx], c, dirty, nd, buckets[BG * g - 2], buckets[BG * g - 1] }
	end
end

-- 3. Decision records: the fresh decisions of each partition, packed into
-- fields of up to 50 bits (offsets in between belong to other shards or were
-- never asked, and are never read here), then the new watermark.
local pow2 = {}
for i = 0, 50 do pow2[i] = 2 ^ i end
for r = 1, nrec do
	local key, mark, a, z = records[r][1], records[r][2], records[r][3], records[r][4]
	local args, m = ARGS, 0
	local start, last, val
	for x = a, z do
		local v = verdict[x]
		if v == 'N' or v == 'D' or v == 'U' then
			local off = el[(x - 1) * stride + 1]
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
		bitfield(key, args, m, 4)
		expireNotBefore(key, recordExpire)
	end
end

-- 4. Filter words. The first sub-operation gives a new key its full length
-- at once, so later writes never grow it.
for i = 1, nwrites do
	local wr = writes[i]
	local key, c, dirty, nd = wr[1], wr[2], wr[3], wr[4]
	if nd > 0 then
		local args = ARGS
		args[1], args[2], args[3], args[4] = 'INCRBY', 'u8', wr[6], '0'
		local m = 4
		for k = 1, nd do
			local off = dirty[k]
			args[m + 1], args[m + 2], args[m + 3], args[m + 4] = 'SET', 'u52', off, fmt('%d', c[off])
			m = m + 4
		end
		bitfield(key, args, m, 4)
		expireNotBefore(key, wr[5])
	end
end

return table.concat(verdict, '', 1, nEl)
