-- Tollgate: token bucket (Rust reference: algorithms/src/token_bucket.rs).
--
-- This file defines one function; the store runs it through layered.lua,
-- which holds the KEYS/ARGV layout (one layer = one call of this function).
--
--   token_bucket(capacity, refill, period_us, cells, now, cost)
--
-- Layer ARGV: algorithm 1, cost, capacity, refill, period_us.
-- State: cells {scaled tokens, last µs, 0}, stored as the string "a b c";
--   tokens are scaled by period_us, so refill scaled tokens accrue per µs.
--   nil: the key holds no state (a new key starts full).
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the next cells and
--   the TTL in milliseconds.
local function token_bucket(capacity, refill, period, cells, now, cost)
  local full = capacity * period
  local stored, last
  if cells then
    stored, last = math.min(cells[1], full), cells[2]
  else
    stored, last = full, now
  end
  local t = math.max(now, last)
  -- Refill since last, capped at full; the elapsed time is compared first
  -- so the product stays below 2^53.
  local to_full = cdiv(full - stored, refill)
  local elapsed = t - last
  local level
  if elapsed >= to_full then
    level = full
  else
    level = stored + elapsed * refill
  end
  local need = cost * period
  if level >= need then
    local left = level - need
    local reset_at = t + cdiv(full - left, refill)
    return true, capacity, fdiv(left, period), after(reset_at, now), -1,
      { left, t, 0 }, ttl_ms(reset_at, now)
  end
  local retry_at = t + cdiv(need - level, refill)
  local reset_at = t + cdiv(full - level, refill)
  return false, capacity, fdiv(level, period), after(reset_at, now), after(retry_at, now)
end
