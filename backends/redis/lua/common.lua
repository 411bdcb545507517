-- Tollgate: helpers shared by every algorithm script.
--
-- This file defines functions only; it is the first part of the script the
-- store runs (see layered.lua for the KEYS/ARGV and reply layout).
--
-- Lua numbers are doubles. Every value Tollgate computes is an integer below
-- 2^53 (policy validation guarantees it), so +, - and * are exact; division is
-- not, so every division goes through fdiv/cdiv, which correct the rounded
-- quotient by one where needed. The result is bit-identical to the Rust
-- reference (tollgate-algorithms), which uses u64 arithmetic.

-- The library functions every call uses, as locals: a local is read
-- directly, a global through two table lookups (`math`, then `floor`).
-- They are set by the first call (`bind`): Redis loads a function library
-- in an environment without `math` and `string`. (`redis.call` stays a
-- global: it is not there at load time either, and it is Redis's to set.)
local floor, max, min, format, match, find, gsub, sub, rep, concat, tonumber

local function bind()
  floor, max, min = math.floor, math.max, math.min
  format, match, find, gsub = string.format, string.match, string.find, string.gsub
  sub, rep, concat = string.sub, string.rep, table.concat
  tonumber = _G.tonumber
end

-- floor(a / b) exactly, for integers a >= 0 (or small negatives) and b > 0.
local function fdiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- ceil(a / b) exactly (Rust's u64::div_ceil).
local function cdiv(a, b)
  local q = fdiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- a mod b exactly, for a >= 0 and b > 0.
local function mod(a, b)
  return a - fdiv(a, b) * b
end

-- at - now, or 0 when at is not after now (Rust: crate::after).
local function after(at, now)
  if at > now then
    return at - now
  end
  return 0
end

-- A state's TTL in milliseconds: until reset_at, rounded up, at least 1
-- (Rust: crate::ttl_until).
local function ttl_ms(reset_at, now)
  local ms = cdiv(after(reset_at, now), 1000)
  if ms < 1 then
    return 1
  end
  return ms
end

-- What the fixed window and the calendar quota share (Rust:
-- algorithms/src/counter.rs): a request of cost against count of limit
-- until stop (an empty count resets at empty_at); returns as an algorithm
-- does, the next cells {count after, b, c}.
local function counted(limit, count, cost, now, empty_at, stop, b, c)
  local allowed = count + cost <= limit
  local count_after = count
  if allowed then
    count_after = count + cost
  end
  local reset_after = after(stop, now)
  if count_after == 0 then
    reset_after = after(empty_at, now)
  end
  -- max() only guards a count written under a larger limit.
  local remaining = max(limit - count_after, 0)
  if allowed then
    return true, limit, remaining, reset_after, -1, ttl_ms(stop, now), count_after, b, c
  end
  return false, limit, remaining, reset_after, after(stop, now)
end

-- A counter's refund (Rust: Refund::from_count): at most its count;
-- returns what it gives and the cells {count left, b, c}.
local function give_from_count(count, cost, b, c)
  local give = min(cost, count)
  if give <= 0 then
    return 0
  end
  return give, count - give, b, c
end

-- An integer as decimal text. tostring() would give 14 significant digits
-- and an exponent ("1.78e+15"), losing the microseconds; '%d' goes through
-- a 64-bit C long, exact for every integer below 2^53 and cheaper than a
-- float format.
local function int(x)
  return format('%d', x)
end

-- A charge no refund rule finds too old (each algorithm's reward_*).
local FAR = 9007199254740991
