-- The call: replays answered from the decision records, the fresh
-- elements decided bucket by bucket, each by its bucket's kind, then the
-- writes. Returns, when the call is refused, '!' and the stages it needs
-- as "bucket:stage" (bucket 1-based in argBuckets), comma-separated.
-- Otherwise one character per element: N new, D duplicate, U new and not
-- filtered (the caller's choice, or its bucket group past its deadline by
-- this server's clock), n/d a replay decided new/duplicate before, u a
-- replay older than the record, k a replay delivered before; for a probe
-- (group probeGroup), k, y decided before and not delivered, or x not
-- decided before (and now, under the record's watermark); then, when
-- stages are due ahead, '+' and those stages as above.

-- The test of a bucket of any kind against candidates, for neighbours.
local function testBucket(ref, xs, n, hit)
	if planOf(ref).kind == kindCodeBloom then return bloomTestBucket(ref, xs, n, hit) end
	return fpTestBucket(ref, xs, n, hit)
end

-- The caller judged lateness by its clock; keys expire by this server's.
-- A group whose deadline has come here is not filtered: its oldest key may
-- be gone, and testing against nothing would call every copy new.
local t = call('TIME')
local nowMs = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
local past = {}
local fresh, nfresh = {}, {}
for g = 1, nb do
	local _, _, _, _, deadline = group(g)
	past[g] = nowMs >= tonumber(deadline) * 1000
	fresh[g], nfresh[g] = {}, 0
end

-- 1. Replays: an offset below a record's delivered mark was delivered
-- (and any other offset of the partition below it too: a probe asks for
-- one), one below its watermark was decided before.
local records, nrec = {}, 0
local x = 1
local deliveredAt = fmt('%d', recordDeliveredBit)
for p = 1, #runs, runStride do
	local key = KEYS[runs[p]]
	local last = x + runs[p + 1] - 1
	local head = call('BITFIELD', key, 'GET', 'u63', '0', 'GET', 'u63', fmt('%d', recordRingBit + R), 'GET', 'u63', deliveredAt)
	local mark, floor, delivered = head[1], head[2], head[3]
	local reads, readEls, nr = {}, {}, 0
	for y = x, last do
		local off, g = offOf[y], groupOf[y]
		if off < delivered then
			verdict[y] = 'k'
		elseif g == probeGroup then
			verdict[y] = (off < mark and off >= floor) and 'y' or 'x'
		elseif off < mark then
			if off >= mark - R and off >= floor then
				nr = nr + 1
				reads[3 * nr - 2] = 'GET'
				reads[3 * nr - 1] = 'u1'
				reads[3 * nr] = fmt('%d', recordRingBit + off % R)
				readEls[nr] = y
			else
				verdict[y] = 'u'
			end
		elseif g > 0 and not past[g] then
			local c = nfresh[g] + 1
			fresh[g][c] = y
			nfresh[g] = c
		else
			verdict[y] = 'U'
		end
	end
	if nr > 0 then
		local got = bitfield(key, reads, 3 * nr, 3)
		for i = 1, nr do
			verdict[readEls[i]] = got[i] == 1 and 'n' or 'd'
		end
	end
	nrec = nrec + 1
	records[nrec] = { key, mark, x, last }
	x = last + 1
end

-- 2. Filters, bucket by bucket in ascending order, so a bucket's new
-- elements are visible to the next bucket's test of its previous bucket.
-- The fill rate is sampled at most this often (ms): often enough to see a
-- spike begin, seldom enough that a few batches do not make the sample.
local RATE_MS = 250
for g = 1, nb do
	local xs, n = fresh[g], nfresh[g]
	if n > 0 then
		local ref, prevRef, nextRef, expiry = group(g)
		local P = planOf(ref)
		local gs = growth(ref)
		local refused
		if P.kind == kindCodeBloom then
			refused = bloomDecide(P, ref, prevRef, nextRef, expiry, xs, n, testBucket)
		else
			refused = fpDecide(P, ref, prevRef, nextRef, expiry, xs, n, testBucket)
		end
		if not refused and gs.k + 1 < P.S then
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
			-- room for no more than the rate fills in the next stage's lead
			-- (at once when it is full), until it is seen made.
			local nxt = gs.k + 1
			if gs.x < nxt and P.cap[gs.k] - gs.n <= gs.r * P.lead[nxt] / 1000 then
				if made(ref, nxt) then
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
-- never asked, and are never read here), then the new watermark, and for a
-- record made now its floor.
local pow2 = {}
for i = 0, 50 do pow2[i] = 2 ^ i end
for r = 1, nrec do
	local key, mark, a, z = records[r][1], records[r][2], records[r][3], records[r][4]
	local args, m = ARGS, 0
	local start, last, val, first, high
	for y = a, z do
		local v = verdict[y]
		if v == 'N' or v == 'D' or v == 'U' then
			local off = offOf[y]
			first = first or off
			high = off
			local b = (v == 'D') and 0 or 1
			if start and off - start < 50 and start % R + (off - start) < R then
				val = val * pow2[off - last] + b
			else
				if start then
					args[m + 1], args[m + 2], args[m + 3], args[m + 4] =
						'SET', 'u' .. (last - start + 1), fmt('%d', recordRingBit + start % R), fmt('%d', val)
					m = m + 4
				end
				start, val = off, b
			end
			last = off
		elseif v == 'x' then
			-- A probe decided now: under the watermark, without a decision
			-- bit, so that its replay is known as decided ('y').
			first = first or offOf[y]
			high = offOf[y]
		end
	end
	if start then
		args[m + 1], args[m + 2], args[m + 3], args[m + 4] =
			'SET', 'u' .. (last - start + 1), fmt('%d', recordRingBit + start % R), fmt('%d', val)
		m = m + 4
	end
	if high then
		if high >= mark then
			args[m + 1], args[m + 2], args[m + 3], args[m + 4] = 'SET', 'u63', '0', fmt('%d', high + 1)
			m = m + 4
		end
		if mark == 0 and first > 0 then
			-- A record made now: older offsets were not decided under it.
			args[m + 1], args[m + 2], args[m + 3], args[m + 4] = 'SET', 'u63', fmt('%d', recordRingBit + R), fmt('%d', first)
			m = m + 4
		end
		bitfield(key, args, m, 4)
		expireNotBefore(key, recordExpire)
	end
end

-- 4. Filters, into keys made whole before (checked above), so no write
-- grows a key; then the growth records; then every key written gets its
-- expiry.
bloomWrite()
fpWrite()
for ref, gs in pairs(grown) do
	local meta = growthRecordOf(ref)
	if gs.dirty and meta > 0 then
		call('HSET', KEYS[meta], 'k', fmt('%d', gs.k), 'n', fmt('%d', gs.n), 'o', fmt('%d', gs.o), 'c', fmt('%d', gs.c),
			'a', fmt('%d', gs.a), 't', fmt('%d', gs.t), 's', fmt('%d', gs.s), 'r', fmt('%.1f', gs.r), 'w', fmt('%d', gs.w), 'x', fmt('%d', gs.x))
	end
end
for k, at in pairs(written) do
	if k > 0 then expireNotBefore(KEYS[k], at) end
end

local out = table.concat(verdict, '', 1, nEl)
if #wants > 0 then out = out .. '+' .. table.concat(wants, ',') end
return out
