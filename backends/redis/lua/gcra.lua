-- Tollgate: GCRA (Rust reference: algorithms/src/gcra.rs).
--
-- This file defines one function; the store runs it through layered.lua,
-- which holds the KEYS/ARGV layout (one layer = one call of this function).
--
--   gcra(burst, interval_us, _, cells, now, cost)
--
-- Layer ARGV: algorithm 2, cost, burst, interval_us, 0.
-- State: cells {TAT µs, last µs, 0}, stored as the string "a b c"; nil: none.
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the next cells and
--   the TTL in milliseconds.
local function gcra(burst, interval, _, cells, now, cost)
  local tolerance = burst * interval
  local tat, last
  if cells then
    tat, last = cells[1], cells[2]
  else
    tat, last = now, now
  end
  local t = math.max(now, last)
  local base = math.max(tat, t)
  local new_tat = base + cost * interval
  if new_tat - t <= tolerance then
    return true, burst, fdiv(tolerance - (new_tat - t), interval), after(new_tat, now), -1,
      { new_tat, t, 0 }, ttl_ms(new_tat, now)
  end
  -- Admitted once the effective time reaches new_tat - tolerance (base does
  -- not move before then). The max() only guards states written under other
  -- parameters; a state this policy wrote always has base - t <= tolerance.
  local retry_at = new_tat - tolerance
  return false, burst, fdiv(math.max(tolerance - (base - t), 0), interval),
    after(base, now), after(retry_at, now)
end
