-- Delivered marks (delivered.go): KEYS are decision records of one slot;
-- ARGV[1] is the bit their delivered mark starts at (deliveredBit: 63
-- bits, as the test-and-set reads it), ARGV[2] the Unix time a record must
-- live until, ARGV[2 + i] the new mark of KEYS[i]. Each record's mark is
-- raised to its new value, never lowered; a record written gets its
-- expiry, a new one included.
local at = ARGV[1]
local expireAt = ARGV[2]
for i = 1, #KEYS do
	local key = KEYS[i]
	local v = tonumber(ARGV[2 + i])
	local cur = redis.call('BITFIELD', key, 'GET', 'u63', at)[1]
	if v > cur then
		redis.call('BITFIELD', key, 'SET', 'u63', at, ARGV[2 + i])
		if redis.call('EXPIREAT', key, expireAt, 'NX') == 0 then
			redis.call('EXPIREAT', key, expireAt, 'GT')
		end
	end
end
return 0
