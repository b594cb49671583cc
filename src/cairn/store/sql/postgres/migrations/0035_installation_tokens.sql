-- A tenant's role never writes an installation token. `installation` is the
-- operator of the whole installation (queue-wide limits every tenant shares),
-- above a tenant's `admin`; tenant_isolation (0008) let a tenant's role write
-- any row of its own tenant, so raw SQL could mint itself one, promote its
-- own token or give the operator's token a secret of its own. Restrictive
-- policies are ANDed with the permissive ones and, like them, bind only roles
-- under row security: the owner (the installation's operator) still mints
-- them with `cairn tokens mint --role installation`.
CREATE POLICY tenant_token_not_installation ON api_tokens AS RESTRICTIVE FOR INSERT
    WITH CHECK (role <> 'installation');
CREATE POLICY tenant_token_stays_below_installation ON api_tokens AS RESTRICTIVE FOR UPDATE
    USING (true)
    WITH CHECK (role <> 'installation');
