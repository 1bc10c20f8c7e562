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

-- fpLoc is element x's position in [0, 1) and its 8 bytes of
-- fingerprint under plan P, decoded once.
local function fpLoc(P, x)
	local us, fps = P.u, P.fp
	if us == nil then
		us, fps = {}, {}
		P.u, P.fp = us, fps
	end
	local u = us[x]
	if u == nil then
		local at = (x - 1) * fpLocationBytes + 1
		u = unpackStruct('>d', P.loc, at)
		us[x], fps[x] = u, sub(P.loc, at + 8, at + fpLocationBytes - 1)
	end
	return u, fps[x]
end

-- The slots this call writes, laid over what GETRANGE reads: pend, key
-- index -> { byte offset -> fingerprint }; chunks, key index -> { chunk
-- -> offsets }, chunks of CB bytes, so a read looks only at the writes
-- near it.
local pend, chunks = {}, {}
local CB = 512

-- fpRead returns bytes [a, a+len) of key k (both multiples of the width,
-- as every write is), with this call's writes laid over; missing bytes (a
-- key not made) read as zeros.
local function fpRead(k, a, len)
	local s = redis.call('GETRANGE', KEYS[k], a, a + len - 1)
	if #s < len then s = s .. string.rep('\0', len - #s) end
	local kc = chunks[k]
	if kc == nil then return s end
	local hits
	for c = math.floor(a / CB), math.floor((a + len - 1) / CB) do
		local l = kc[c]
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

-- alignedFind is the first slot (0-based) of s, in slots of w bytes, that
-- holds pat; nil for none.
local function alignedFind(s, pat, w)
	local i = 1
	while true do
		local p = find(s, pat, i, true)
		if p == nil then return nil end
		if (p - 1) % w == 0 then return (p - 1) / w end
		i = p + 1
	end
end

-- fpFind looks for element x (plan P) in stage st of bucket ref: whether
-- its fingerprint is in the run from its home to the first empty slot;
-- and, when not, the key and byte offset of that empty slot (nil when the
-- run reaches fpProbeLimit slots: the stage is full for x) and the
-- fingerprint to store there.
local function fpFind(P, ref, st, x)
	local w = P.width[st]
	local u, fp8 = fpLoc(P, x)
	local f = sub(fp8, 1, w)
	if f == ZERO[w] then f = ONE[w] end
	local per = P.per[st]
	local slot = math.floor(u * P.size[st])
	local part = math.floor(slot / per)
	local k = stageKey(ref, st) + part
	local a = (slot - part * per) * w
	local got, n = 0, fpFirstRead
	while got < fpProbeLimit do
		n = math.min(n, fpProbeLimit - got)
		local s = fpRead(k, a + got * w, n * w)
		local e = alignedFind(s, ZERO[w], w)
		local m = alignedFind(s, f, w)
		if m and (e == nil or m < e) then return true end
		if e then return false, k, a + (got + e) * w, f end
		got = got + n
		n = 4 * fpFirstRead
	end
	return false, nil, nil, f
end

-- fpTestBucket tests the candidates against every stage of bucket ref,
-- newest first, and returns those it did not hold.
local function fpTestBucket(ref, xs, n, hit)
	local P = planOf(ref)
	local top = growth(ref).k
	local left, nl = {}, 0
	for i = 1, n do
		local x = xs[i]
		local found = false
		for st = top, 0, -1 do
			if fpFind(P, ref, st, x) then
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

-- fpStore notes fingerprint f for byte offset pos of key k, to be written
-- at the end of the call and seen by the reads before.
local function fpStore(k, pos, f, expiry)
	local pk = pend[k]
	if pk == nil then
		pk = {}
		pend[k], chunks[k] = pk, {}
		written[k] = expiry
	end
	pk[pos] = f
	local c = math.floor(pos / CB)
	local l = chunks[k][c]
	if l == nil then
		l = {}
		chunks[k][c] = l
	end
	l[#l + 1] = pos
end

-- fpDecide decides the fresh elements xs[1..n] of bucket ref (plan P), in
-- order, testing the neighbours given (testOther, any kind), and reports
-- whether the call is refused. An element found nowhere is new, and
-- stored in the newest stage's first empty slot from its home; a run as
-- long as fpProbeLimit makes that stage full, as at its capacity.
local function fpDecide(P, ref, prevRef, nextRef, expiry, xs, n, testOther)
	local gs = growth(ref)
	local one, seen = {}, {} -- a candidate at a time, and what testOther marks
	for i = 1, n do
		local x = xs[i]
		local k0 = gs.k
		local found, key, pos, f = fpFind(P, ref, k0, x)
		for st = k0 - 1, 0, -1 do
			if found then break end
			found = fpFind(P, ref, st, x)
		end
		for _, other in ipairs({ prevRef, nextRef }) do
			if found then break end
			if other > 0 then
				one[1] = x
				local _, left = testOther(other, one, 1, seen)
				found = left == 0
			end
		end
		if found then
			verdict[x] = 'D'
		else
			verdict[x] = 'N'
			local a = admit(ref, gs, P)
			if a == 'refuse' then return true end
			if a == 'insert' and gs.k == k0 and key == nil then
				-- Full for x: the stage counts as full, as at its capacity.
				gs.n, gs.a = P.cap[gs.k], gs.a - 1
				a = admit(ref, gs, P)
				if a == 'refuse' then return true end
			end
			if a == 'insert' and gs.k ~= k0 then
				found, key, pos, f = fpFind(P, ref, gs.k, x)
			end
			if a == 'insert' then
				if key then
					fpStore(key, pos, f, expiry)
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
	for k, pk in pairs(pend) do
		for pos, f in pairs(pk) do
			redis.call('SETRANGE', KEYS[k], pos, f)
		end
	end
end
