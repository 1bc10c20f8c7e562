-- The fingerprint kind: a table of fingerprints with linear probing (see
-- the package doc, Fingerprints). An element's home in a stage is slot
-- floor(u * slots), its fingerprint the stage's width of bytes from its
-- hash (never all zero, which marks an empty slot); it is stored in the
-- first empty slot at or after its home. A lookup reads from the home
-- with one GETRANGE (fpFirstRead slots; a longer run is read on) and finds
-- the first empty slot and the fingerprint with string.find; an insert is
-- one SETRANGE.

local fpFirstRead, fpProbeLimit = 32, 512 -- plan_fingerprint.go's

local ZERO, ONE = {}, {}
for b = 1, 8 do
	ZERO[b] = string.rep('\0', b)
	ONE[b] = string.rep('\0', b - 1) .. '\1'
end

-- fpStage describes stage st of bucket ref (plan P) for lookups: its
-- width w, slots per shard and per key, first key, and the empty and the
-- stand-in fingerprints of its width; once per stage and call.
local stages = {}
local function fpStage(P, ref, st)
	local base = stageKey(ref, st)
	local d = stages[base]
	if d == nil then
		local w = P.width[st]
		d = { st = st, w = w, size = P.size[st], per = P.per[st], base = base, zero = ZERO[w], one = ONE[w] }
		stages[base] = d
	end
	return d
end

-- The slots this call writes, laid over what GETRANGE reads: pend, key
-- index -> { byte offset -> fingerprint }; chunks, key index -> { chunk
-- -> offsets }, chunks of CB bytes, so a read looks only at the writes
-- near it.
local pend, chunks = {}, {}
local CB = 512

-- fpOverlay lays this call's writes over s, bytes [a, a+len) of key k
-- (both multiples of the width, as every write is).
local function fpOverlay(k, a, len, s)
	local kc = chunks[k]
	local hits
	for c = floor(a / CB), floor((a + len - 1) / CB) do
		local l = kc[c]
		if type(l) == 'number' then l = { l } end
		if l then
			for _, pos in ipairs(l) do
				if pos >= a and pos < a + len then
					hits = hits or {}
					hits[#hits + 1] = pos
				end
			end
		end
	end
	if hits == nil then return s end
	table.sort(hits)
	local out, last, pk = {}, 1, pend[k]
	for _, pos in ipairs(hits) do
		local i = pos - a + 1
		out[#out + 1] = sub(s, last, i - 1)
		out[#out + 1] = pk[pos]
		last = i + #pk[pos]
	end
	out[#out + 1] = sub(s, last)
	return table.concat(out)
end

-- fpFind looks for the element whose location starts at byte at of loc
-- (protocol.go, fpLocation*) in the stage d (fpStage): whether its
-- fingerprint is in the run from its home to the first empty slot; and,
-- when not, the key and byte offset of that empty slot (nil when the run
-- reaches fpProbeLimit slots: the stage is full for it) and the
-- fingerprint to store there. In stage 0 the first read's part and bounds
-- come with the call, as decimal text: a number given to redis.call is
-- formatted, which costs more than the read.
local function fpFind(d, loc, at)
	local w = d.w
	local f = sub(loc, at + fpLocFingerprint, at + fpLocFingerprint + w - 1)
	if f == d.zero then f = d.one end
	local k, a, from, to
	if d.st == 0 then
		local part, home, l1 = unpackStruct('>I2I4B', loc, at + fpLocPart)
		from = sub(loc, at + fpLocFrom + 1, at + fpLocFrom + l1)
		local l2 = unpackStruct('B', loc, at + fpLocTo)
		to = sub(loc, at + fpLocTo + 1, at + fpLocTo + l2)
		k, a = d.base + part, home
	else
		local per = d.per
		local slot = floor(unpackStruct('>d', loc, at + fpLocPosition) * d.size)
		local part = floor(slot / per)
		k, a = d.base + part, (slot - part * per) * w
		from, to = a, a + fpFirstRead * w - 1
	end
	local zero = d.zero
	local got, n = 0, fpFirstRead
	while got < fpProbeLimit do
		local len = n * w
		local s = call('GETRANGE', KEYS[k], from, to)
		local start = a + got * w
		if #s < len then s = s .. string.rep('\0', len - #s) end
		local kc = chunks[k]
		if kc then
			for c = floor(start / CB), floor((start + len - 1) / CB) do
				if kc[c] then
					s = fpOverlay(k, start, len, s)
					break
				end
			end
		end
		-- The first empty slot, and the fingerprint before it; a match
		-- across two slots is not one, and is looked past.
		local e = find(s, zero, 1, true)
		while e and (e - 1) % w ~= 0 do e = find(s, zero, e + 1, true) end
		local m = find(s, f, 1, true)
		while m and (m - 1) % w ~= 0 do m = find(s, f, m + 1, true) end
		if m and (e == nil or m < e) then return true end
		if e then
			-- An empty home, the common case, is written at the text sent.
			if e == 1 and got == 0 then return false, k, start, f, from end
			return false, k, start + e - 1, f
		end
		got = got + n
		n = mmin(4 * fpFirstRead, fpProbeLimit - got)
		from, to = a + got * w, a + (got + n) * w - 1
	end
	return false, nil, nil, f
end

-- fpRun is fpFind's first read in stage 0 (width w, empty pattern zero)
-- of key k from the home at byte a, whose bounds the call sent as text
-- (from, to), for fingerprint f: the common case, with nothing made anew.
-- Its answers are fpFind's; past the first read it hands over to fpFind
-- (d, loc, at).
local function fpRun(k, a, from, to, f, w, zero, d, loc, at)
	local len = fpFirstRead * w
	local s = call('GETRANGE', KEYS[k], from, to)
	if #s < len then s = s .. string.rep('\0', len - #s) end
	local kc = chunks[k]
	if kc and (kc[floor(a / CB)] or kc[floor((a + len - 1) / CB)]) then s = fpOverlay(k, a, len, s) end
	local e = find(s, zero, 1, true)
	while e and (e - 1) % w ~= 0 do e = find(s, zero, e + 1, true) end
	local m = find(s, f, 1, true)
	while m and (m - 1) % w ~= 0 do m = find(s, f, m + 1, true) end
	if m and (e == nil or m < e) then return true end
	if e == 1 then return false, k, a, f, from end
	if e then return false, k, a + e - 1, f end
	return fpFind(d, loc, at) -- a run longer than the first read
end

-- fpTestBucket tests the candidates against every stage of bucket ref,
-- newest first, and returns those it did not hold.
local function fpTestBucket(ref, xs, n, hit)
	local P = planOf(ref)
	local top = growth(ref).k
	local left, nl = {}, 0
	for i = 1, n do
		local x = xs[i]
		local at = (x - 1) * fpLocationBytes + 1
		local found = false
		for st = top, 0, -1 do
			if made(ref, st) and fpFind(fpStage(P, ref, st), P.loc, at) then
				found = true
				break
			end
		end
		if found then
			hit[x] = true
		else
			nl = nl + 1
			left[nl] = x
		end
	end
	return left, nl
end

-- fpStore notes fingerprint f for byte offset pos of key k (text: pos as
-- decimal text, when the call sent it), to be written at the end of the
-- call and seen by the reads before: in pend and chunks (a chunk's first
-- write as its offset, a table once it has more), and in the list of
-- writes.
local wk, wpos, wf, wn = {}, {}, {}, 0
local function fpStore(k, pos, f, expiry, text)
	local pk = pend[k]
	if pk == nil then
		pk = {}
		pend[k], chunks[k] = pk, {}
		written[k] = expiry
	end
	pk[pos] = f
	wn = wn + 1
	wk[wn], wpos[wn], wf[wn] = k, text or pos, f
	local kc, c = chunks[k], floor(pos / CB)
	local l = kc[c]
	if l == nil then
		kc[c] = pos
	elseif type(l) == 'number' then
		kc[c] = { l, pos }
	else
		l[#l + 1] = pos
	end
end

-- fpDecide decides the fresh elements xs[1..n] of bucket ref (plan P), in
-- order, testing the neighbours given (those of another kind through
-- testOther), and reports whether the call is refused. An element found
-- nowhere is new, and stored in the newest stage's first empty slot from
-- its home; a run as long as fpProbeLimit makes that stage full, as at its
-- capacity. A neighbour's stage not made holds nothing and is not read.
local function fpDecide(P, ref, prevRef, nextRef, expiry, xs, n, testOther)
	local gs = growth(ref)
	-- The neighbours' stages to read, newest first: fingerprint tables
	-- read here, others through testOther.
	local nbRef, nbSt, nbn, others = {}, {}, 0, {}
	for _, other in ipairs({ prevRef, nextRef }) do
		if other > 0 then
			local O = planOf(other)
			if O.kind ~= kindCodeFingerprint then
				others[#others + 1] = other
			else
				for st = growth(other).k, 0, -1 do
					if made(other, st) then
						nbn = nbn + 1
						nbRef[nbn], nbSt[nbn] = other, st
					end
				end
			end
		end
	end
	-- Each neighbour stage, described, with where the elements are under
	-- its plan.
	local nbDesc, nbLoc, nbSame = {}, {}, {}
	for j = 1, nbn do
		local O = planOf(nbRef[j])
		nbDesc[j], nbLoc[j] = fpStage(O, nbRef[j], nbSt[j]), O.loc
		-- Stage 0 of the same plan: the element's first read there is its
		-- own stage 0's, in another bucket's keys.
		nbSame[j] = O == P and nbSt[j] == 0
	end
	local w0 = P.width[0]
	local zero0 = ZERO[w0]
	-- An element's fingerprint, part, home and first byte as text, in one
	-- unpack: the fingerprint's bytes, padding to fpLocPart, then the part,
	-- the home, and the text's length byte and text (protocol.go lays
	-- fpLocPart, fpLocHome and fpLocFrom out one after another; the
	-- bound's text, at fpLocTo, is a second unpack).
	local head0 = '>c' .. w0 .. string.rep('x', fpLocPart - fpLocFingerprint - w0) .. 'I2I4Bc0'
	local one, seen = {}, {} -- a candidate at a time for testOther, and what it marks
	local loc = P.loc
	local dk, d0 -- the newest stage, described
	for i = 1, n do
		local x = xs[i]
		local at = (x - 1) * fpLocationBytes + 1
		local k0 = gs.k
		if k0 ~= dk then dk, d0 = k0, fpStage(P, ref, k0) end
		-- Stage 0's first read: its part, home and bounds as sent, and the
		-- fingerprint, taken once for every stage 0 of this plan the
		-- element is looked up in (its own and, usually, its neighbours').
		local f0, part, home, from = unpackStruct(head0, loc, at + fpLocFingerprint)
		local to = unpackStruct('Bc0', loc, at + fpLocTo)
		if f0 == zero0 then f0 = ONE[w0] end
		local found, key, pos, f, text
		if k0 == 0 then
			found, key, pos, f, text = fpRun(d0.base + part, home, from, to, f0, w0, zero0, d0, loc, at)
		else
			found, key, pos, f, text = fpFind(d0, loc, at)
		end
		for st = k0 - 1, 0, -1 do
			if found then break end
			if st == 0 then
				local d = fpStage(P, ref, 0)
				found = fpRun(d.base + part, home, from, to, f0, w0, zero0, d, loc, at)
			else
				found = fpFind(fpStage(P, ref, st), loc, at)
			end
		end
		for j = 1, nbn do
			if found then break end
			local d = nbDesc[j]
			if nbSame[j] then
				found = fpRun(d.base + part, home, from, to, f0, w0, zero0, d, loc, at)
			else
				found = fpFind(d, nbLoc[j], at)
			end
		end
		for j = 1, #others do
			if found then break end
			one[1] = x
			local _, left = testOther(others[j], one, 1, seen)
			found = left == 0
		end
		if found then
			verdict[x] = 'D'
		else
			verdict[x] = 'N'
			local a
			if gs.madeK == gs.k and gs.n < P.cap[gs.k] then -- admit's common case, inline
				gs.n, gs.a, gs.dirty = gs.n + 1, gs.a + 1, true
				a = 'insert'
			else
				a = admit(ref, gs, P)
			end
			if a == 'refuse' then return true end
			if a == 'insert' and gs.k == k0 and key == nil then
				-- Full for x: the stage counts as full, as at its capacity.
				gs.n, gs.a = P.cap[gs.k], gs.a - 1
				a = admit(ref, gs, P)
				if a == 'refuse' then return true end
			end
			if a == 'insert' and gs.k ~= k0 then
				found, key, pos, f, text = fpFind(fpStage(P, ref, gs.k), loc, at)
			end
			if a == 'insert' then
				if key then
					fpStore(key, pos, f, expiry, text)
				else
					gs.n, gs.a, gs.c = gs.n - 1, gs.a - 1, gs.c + 1 -- a stage just handed over to, full: not inserted
				end
			end
		end
	end
	return false
end

-- fpWrite writes the slots this call stored, one SETRANGE each.
local function fpWrite()
	for i = 1, wn do
		call('SETRANGE', KEYS[wk[i]], wpos[i], wf[i])
	end
end
