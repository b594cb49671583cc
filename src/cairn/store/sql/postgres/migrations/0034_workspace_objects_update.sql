-- Storing a workspace object that is already stored moves its stored_at to
-- now (issue 27): the collector (cairn.api.wscollect) deletes an object only
-- if it was still last stored before the collection began, so a snapshot
-- that stores an object again while a collection runs keeps it. The
-- store's INSERT ... ON CONFLICT DO UPDATE needs UPDATE for a tenant's role.
UPDATE tenant_privileges SET privileges = 'SELECT, INSERT, UPDATE, DELETE'
WHERE object_name = 'workspace_objects';

SELECT grant_privileges('workspace_objects');
