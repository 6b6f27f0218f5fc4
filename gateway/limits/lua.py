"""The Redis scripts: one EVALSHA per admission, one per settlement.

Per scope there are three keys: ``log`` (ZSET ticket -> admission µs), ``tok`` (HASH ticket -> tokens
charged, plus ``#sum``, the running total of the window), ``slots`` (ZSET ticket -> lease expiry µs; a ticket of
k sequences holds k members, ``ticket``, ``ticket#1`` .. ``ticket#k-1``, so ZCARD counts sequences). Budgets are the
budget book's (redis_budgets.py). Times are integer µs; by default the server's TIME, so
replicas with skewed clocks still share one window.
"""

ADMIT = r"""
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local window = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local id = ARGV[4]
local tokens = tonumber(ARGV[5])
local sequences = tonumber(ARGV[6])
local cut = now - window
local n = #KEYS / 3
local BATCH = 500  -- unpack() has a stack limit; work through long logs in slices

-- drop entries that left the window, keeping the running sum in step with the hash
local function trim(log, tok)
  while true do
    local old = redis.call('ZRANGEBYSCORE', log, '-inf', cut, 'LIMIT', 0, BATCH)
    if #old == 0 then return end
    local amounts = redis.call('HMGET', tok, unpack(old))
    local gone = 0
    for j = 1, #amounts do gone = gone + (tonumber(amounts[j]) or 0) end
    redis.call('HDEL', tok, unpack(old))
    redis.call('ZREM', log, unpack(old))
    if gone ~= 0 then redis.call('HINCRBY', tok, '#sum', 0 - gone) end  -- never send -0
    if #old < BATCH then return end
  end
end

-- µs until the oldest entries that free at least `need` tokens have left the window
local function token_wait(log, tok, need)
  local start, freed = 0, 0
  while true do
    local e = redis.call('ZRANGE', log, start, start + BATCH - 1, 'WITHSCORES')
    if #e == 0 then return 0 end
    local ids = {}
    for j = 1, #e, 2 do ids[#ids + 1] = e[j] end
    local amounts = redis.call('HMGET', tok, unpack(ids))
    for j = 1, #ids do
      freed = freed + (tonumber(amounts[j]) or 0)
      if freed >= need then return tonumber(e[2 * j]) + window - now end
    end
    start = start + BATCH
  end
end

local obs = {}
local blocked = false
for i = 1, n do
  local log, tok, slots = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local a = 7 + 3 * (i - 1)
  local rpm, tpm, maxc = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local count, sum, inflight = 0, 0, 0
  local rw, tw, cw = -1, -1, -1  -- µs until each clears; -1 = not blocking
  if rpm >= 0 or tpm >= 0 then
    trim(log, tok)
    count = redis.call('ZCARD', log)
    sum = tonumber(redis.call('HGET', tok, '#sum') or '0')
    if rpm >= 0 and count + 1 > rpm then
      local e = redis.call('ZRANGE', log, count - rpm, count - rpm, 'WITHSCORES')
      rw = math.max(0, tonumber(e[2]) + window - now)
    end
    if tpm >= 0 and sum + tokens > tpm then
      tw = math.max(0, token_wait(log, tok, sum + tokens - tpm))
    end
  end
  if maxc >= 0 then
    redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)  -- leases of requests that never settled
    inflight = redis.call('ZCARD', slots)
    if inflight + math.max(1, math.min(sequences, maxc)) > maxc then cw = 0 end
  end
  if rw >= 0 or tw >= 0 or cw >= 0 then blocked = true end
  obs[i] = {rpm, tpm, maxc, count, sum, inflight, rw, tw, cw}
end

local out = {blocked and 0 or 1, now}
for i = 1, n do
  local o = obs[i]
  local log, tok, slots = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local count, sum, inflight = o[4], o[5], o[6]
  if not blocked then
    if o[1] >= 0 or o[2] >= 0 then
      redis.call('ZADD', log, now, id)
      redis.call('HSET', tok, id, tokens)
      sum = redis.call('HINCRBY', tok, '#sum', tokens)
      count = count + 1
      redis.call('PEXPIRE', log, math.floor(window / 1000) + 1000)
      redis.call('PEXPIRE', tok, math.floor(window / 1000) + 1000)
    end
    if o[3] >= 0 then
      local held = math.max(1, math.min(sequences, o[3]))  -- one slot per sequence, at most the whole cap
      local members = {now + lease, id}
      for k = 1, held - 1 do
        members[#members + 1] = now + lease
        members[#members + 1] = id .. '#' .. k
      end
      redis.call('ZADD', slots, unpack(members))
      redis.call('PEXPIRE', slots, math.floor(lease / 1000) + 1000)
      inflight = inflight + held
    end
  end
  local oldest = -1
  if count > 0 then oldest = tonumber(redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')[2]) end
  for _, v in ipairs({count, sum, inflight, oldest, o[7], o[8], o[9]}) do out[#out + 1] = v end
end
return out
"""

SETTLE = r"""
local id = ARGV[1]
local delta = tonumber(ARGV[2])
local members = {id}
for k = 1, tonumber(ARGV[3]) - 1 do members[#members + 1] = id .. '#' .. k end
for i = 1, #KEYS / 3 do
  local tok, slots = KEYS[3 * i - 1], KEYS[3 * i]
  redis.call('ZREM', slots, unpack(members))
  -- only an entry still in the window holds tokens; an expired one was already subtracted
  if redis.call('HEXISTS', tok, id) == 1 then
    redis.call('HINCRBY', tok, id, delta)
    redis.call('HINCRBY', tok, '#sum', delta)
  end
end
return 1
"""
