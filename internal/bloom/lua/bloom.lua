-- The Bloom kind: an element sets a few bits in each of W words of 52 bits
-- (see the package doc, Sizing); testing and setting it is one BITFIELD
-- read and, when new, one write per word.

local HALF = 67108864 -- 2^26

-- bloomPlace is where word j of element x is in stage st (first key
-- base) of plan P: the key's index and the word's bit offset in it. Stage
-- 0's offset comes with the call; later stages' from the word's position
-- in [0, 1), in the part that holds it.
local function bloomPlace(P, base, x, st, j)
	if st == 0 then return base, P.offs[(x - 1) * P.W + j] end
	local w = floor(P.loc[(x - 1) * P.stride + P.W + j] * P.size[st])
	local per = P.per[st]
	local pt = floor(w / per)
	-- As a decimal string: Redis versions format Lua numbers of 1e9 and up
	-- differently, some in a form BITFIELD refuses.
	return base + pt, fmt('%d', (w - pt * per) * 52)
end

-- words is this call's value of each word it wrote: filter key index ->
-- { word offset -> new value }.
local words = {}
local function cached(k, off)
	local c = words[k]
	return c and c[off]
end

-- getWords reads words j1..j2 in stage st (first key base) of plan P of
-- the n elements xs[1..n], in that order: one BITFIELD per key it touches.
local function getWords(P, base, st, xs, n, j1, j2)
	if P.parts[st] == 1 then
		local args, m = ARGS, 0
		if st == 0 then -- the common case, inline
			local offs, W = P.offs, P.W
			for i = 1, n do
				local ob = (xs[i] - 1) * W
				for j = j1, j2 do
					args[m + 1] = 'GET'
					args[m + 2] = 'u52'
					args[m + 3] = offs[ob + j]
					m = m + 3
				end
			end
		else
			for i = 1, n do
				local x = xs[i]
				for j = j1, j2 do
					local _, off = bloomPlace(P, base, x, st, j)
					args[m + 1] = 'GET'
					args[m + 2] = 'u52'
					args[m + 3] = off
					m = m + 3
				end
			end
		end
		if m == 0 then return {} end
		return bitfield(KEYS[base], args, m, 3)
	end
	local byKey, m = {}, 0 -- key index -> its GETs, and where each reply goes
	for i = 1, n do
		local x = xs[i]
		for j = j1, j2 do
			m = m + 1
			local k, off = bloomPlace(P, base, x, st, j)
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

-- holds reports whether word value v has every bit of mask mk, testing the
-- high and the low 26 bits with Lua's 32-bit bit library.
local function holds(v, mk)
	local l, ml = v % HALF, mk % HALF
	local mh = (mk - ml) / HALF
	return band((v - l) / HALF, mh) == mh and band(l, ml) == ml
end

-- bloomInStage tests the candidates xs[1..n] against stage st (first key
-- base) of plan P: the first word for all, the others only where the first
-- holds, with the writes of this call seen through the words' cache. It
-- sets hit[x] and returns the candidates it did not hold.
local function bloomInStage(P, base, st, xs, n, hit)
	local W, loc, stride = P.W, P.loc, P.stride
	local first = getWords(P, base, st, xs, n, 1, 1)
	local more, nm = {}, 0
	for i = 1, n do
		local x = xs[i]
		if holds(cached(bloomPlace(P, base, x, st, 1)) or first[i], loc[(x - 1) * stride + 1]) then
			nm = nm + 1
			more[nm] = x
		end
	end
	local rest = W > 1 and nm > 0 and getWords(P, base, st, more, nm, 2, W) or {}
	for i = 1, nm do
		local x = more[i]
		local rb, mb = (i - 1) * (W - 1) - 1, (x - 1) * stride
		local all = true
		for j = 2, W do
			if not holds(cached(bloomPlace(P, base, x, st, j)) or rest[rb + j], loc[mb + j]) then
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

-- bloomTestBucket tests the candidates against every stage of bucket ref,
-- newest first, and returns those it did not hold.
local function bloomTestBucket(ref, xs, n, hit)
	local P = planOf(ref)
	for st = growth(ref).k, 0, -1 do
		if n == 0 then break end
		xs, n = bloomInStage(P, stageKey(ref, st), st, xs, n, hit)
	end
	return xs, n
end

-- dirtyOf: filter key index -> { n, offsets... }, the words to write;
-- touched: the first key of each stage this call inserts into.
local dirtyOf, touched = {}, {}

-- bloomInsert sets element x's words in stage st (first key base) of plan
-- P, whose newest stage read is vals (at vb) when st is the stage read.
local function bloomInsert(P, base, st, x, vals, vb, readStage, expiry)
	local W, offs, loc = P.W, P.offs, P.loc
	local ob, mb = (x - 1) * W, (x - 1) * P.stride
	for j = 1, W do
		local keyIdx, off
		if st == 0 then
			keyIdx, off = base, offs[ob + j]
		else
			keyIdx, off = bloomPlace(P, base, x, st, j)
		end
		local c = words[keyIdx]
		if c == nil then
			c = {}
			words[keyIdx] = c
			dirtyOf[keyIdx] = { 0 }
			written[keyIdx] = expiry
		end
		local v = c[off]
		if v == nil then
			v = (st == readStage and vals[vb + j]) or 0
			local d = dirtyOf[keyIdx]
			d[1] = d[1] + 1
			d[d[1] + 1] = off
		end
		local l = v % HALF
		local h = (v - l) / HALF
		local mk = loc[mb + j]
		local ml = mk % HALF
		local mh = (mk - ml) / HALF
		c[off] = bor(h, mh) * HALF + bor(l, ml)
	end
end

-- bloomDecide decides the fresh elements xs[1..n] of bucket ref (plan P),
-- testing the neighbours given (testOther, any kind), and reports whether
-- the call is refused. The newest stage is read whole, as the words
-- inserts will change; the older ones, full, are tested like the
-- neighbours.
local function bloomDecide(P, ref, prevRef, nextRef, expiry, xs, n, testOther)
	local W = P.W
	local gs = growth(ref)
	local k0 = gs.k
	local keyOf = {}
	for st = 0, P.S - 1 do keyOf[st] = stageKey(ref, st) end
	local vals = getWords(P, keyOf[k0], k0, xs, n, 1, W)
	local hit = {}
	local cand, nc = {}, 0
	-- With one stage and no neighbour (a fixed window that has not grown),
	-- the decision below tests the stage read, as it must anyway for the
	-- writes of this call: no test ahead of it.
	local pretest = k0 > 0 or prevRef + nextRef > 0
	local loc, stride = P.loc, P.stride
	for k = 1, pretest and n or 0 do
		local x = xs[k]
		local vb, mb = (k - 1) * W, (x - 1) * stride
		local all = true
		for j = 1, W do
			if not holds(vals[vb + j], loc[mb + j]) then
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
		cand, nc = bloomInStage(P, keyOf[st], st, cand, nc, hit)
	end
	-- The rest are tested against every stage of the neighbours given
	-- (the previous bucket; the next one when it may hold copies).
	for _, other in ipairs({ prevRef, nextRef }) do
		if other > 0 and nc > 0 then cand, nc = testOther(other, cand, nc, hit) end
	end

	-- Decide in order: an element held by none is new, and inserted in
	-- the newest stage, whose cache makes it visible to later elements of
	-- the call.
	local offs = P.offs
	for k = 1, n do
		local x = xs[k]
		local vb, mb = (k - 1) * W, (x - 1) * stride
		local dup = hit[x]
		for st = k0, gs.k do
			if dup then break end
			-- Without writes in this call, stage k0 holds what vals held,
			-- tested above if pretest.
			if touched[keyOf[st]] or st ~= k0 or not pretest then
				local all = true
				local c0 = st == 0 and words[keyOf[0]] -- stage 0: inline, the common case
				local ob = (x - 1) * W
				for j = 1, W do
					local v
					if st == 0 then
						v = c0 and c0[offs[ob + j]]
					else
						v = cached(bloomPlace(P, keyOf[st], x, st, j))
					end
					v = v or (st == k0 and vals[vb + j]) or 0
					if not holds(v, loc[mb + j]) then
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
			local a = admit(ref, gs, P)
			if a == 'refuse' then return true end
			if a == 'insert' then
				touched[keyOf[gs.k]] = true
				bloomInsert(P, keyOf[gs.k], gs.k, x, vals, vb, k0, expiry)
			end
		end
	end
	return false
end

-- bloomWrite writes the words this call set, one BITFIELD per key.
local function bloomWrite()
	for keyIdx, d in pairs(dirtyOf) do
		local c, nd = words[keyIdx], d[1]
		if nd > 0 then
			local args, m = ARGS, 0
			for k = 1, nd do
				local off = d[k + 1]
				args[m + 1], args[m + 2], args[m + 3], args[m + 4] = 'SET', 'u52', off, fmt('%d', c[off])
				m = m + 4
			end
			bitfield(KEYS[keyIdx], args, m, 4)
		end
	end
end
